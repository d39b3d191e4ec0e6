//! The shape of the code: in every crate, imports between its top-level modules run one
//! way (no circle), and no source file outside the tests is over 600 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest source file outside the tests, in lines.
const MAX_LINES: usize = 600;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_owned()
}

/// Every crate's `src/`.
fn crates() -> Vec<PathBuf> {
    let root = root();
    let mut dirs = vec![
        root.join("shared/src"),
        root.join("contracts/src"),
        root.join("cli/src"),
        root.join("tests/src"),
    ];
    for service in std::fs::read_dir(root.join("services")).expect("services/") {
        dirs.push(service.expect("a service").path().join("src"));
    }
    dirs.retain(|d| d.is_dir());
    dirs
}

/// The `.rs` files below `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("a readable folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The first names of the paths `crate::…` in `code`: `crate::a::b` and
/// `crate::{a, b::c, d as e}` name `a`, `b`, `d`.
fn crate_imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            // The items of the list at its own depth.
            let (mut depth, mut item) = (0usize, String::new());
            for c in list.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            names.insert(ident(item.trim()));
        } else {
            names.insert(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// Code of a file without its comments and its test module.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The imports between the top-level modules of the crate at `src`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(src) {
        let relative = file.strip_prefix(src).expect("below src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("a name")
            .trim_end_matches(".rs")
            .to_owned();
        if matches!(top.as_str(), "lib" | "main" | "bin") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
        let imports = crate_imports(&code);
        graph
            .entry(top.clone())
            .or_default()
            .extend(imports.into_iter().filter(|m| *m != top));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

/// A circle of imports in `graph`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    /// Not seen, on the current path, done.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        node: &str, graph: &BTreeMap<String, BTreeSet<String>>, marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in &graph[node] {
            match marks[next.as_str()] {
                Mark::Open => {
                    let from = path.iter().position(|n| n == next).expect("on the path");
                    let mut found = path[from..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Mark::New => {
                    if let Some(found) = visit(next, graph, marks, path) {
                        return Some(found);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks: BTreeMap<String, Mark> = graph.keys().map(|k| (k.clone(), Mark::New)).collect();
    for node in graph.keys() {
        if marks[node.as_str()] == Mark::New {
            if let Some(found) = visit(node, graph, &mut marks, &mut Vec::new()) {
                return Some(found);
            }
        }
    }
    None
}

#[test]
fn imports_between_a_crates_modules_run_one_way() {
    // The reader itself: a circle is found, and every form of import counts.
    let sample: BTreeMap<String, BTreeSet<String>> = [
        ("a", crate_imports("use crate::b::X;")),
        ("b", crate_imports("use crate::{c as d, e::{F, G}};")),
        ("c", crate_imports("fn f() { crate::a::g() }")),
        ("e", BTreeSet::new()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(sample["b"], BTreeSet::from(["c".into(), "e".into()]));
    assert_eq!(
        circle(&sample),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );

    let mut circles = Vec::new();
    for src in crates() {
        if let Some(found) = circle(&module_graph(&src)) {
            circles.push(format!("{}: {}", src.display(), found.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_source_file_outside_the_tests_is_over_600_lines() {
    let root = root();
    let mut long = Vec::new();
    for src in crates() {
        if src.starts_with(root.join("tests")) {
            continue;
        }
        for file in sources(&src) {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let lines = std::fs::read_to_string(&file)
                .expect("readable")
                .lines()
                .count();
            if lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}
