//! The shape of the code: in every crate, the imports between the modules inside each
//! module (its top level included) run one way (no circle), and no source file outside the
//! tests is over 600 lines, and no code outside the tests builds JSON with `json!` but the
//! OpenAPI builder; the image build copies every crate of the workspace; the tests start no
//! more whole stacks than their ceiling.

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

/// The workspace's members as `Cargo.toml` lists them (`members = ["a", "b/c", ...]`).
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.starts_with("members = ["))
        .expect("a members line");
    let list = line["members = [".len()..].trim_end_matches(']');
    let members: Vec<String> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .collect();
    assert!(members.len() > 5 && members.iter().all(|m| !m.is_empty()));
    members
}

/// Every crate's `src/`.
fn crates() -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = members()
        .iter()
        .map(|m| root().join(m).join("src"))
        .collect();
    for dir in &dirs {
        assert!(dir.is_dir(), "{} is missing", dir.display());
    }
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

/// A path's segments.
type ModPath = Vec<String>;

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Reads the use tree at the start of `s` below `prefix` into `out` (`a::b`, `a::{b, c::d}`,
/// `a::{self, b}`, `a as b`); answers how many bytes it took.
fn use_tree(s: &str, prefix: &ModPath, out: &mut BTreeSet<ModPath>) -> usize {
    let mut path = prefix.clone();
    let mut at = 0;
    loop {
        let name = ident(&s[at..]);
        if name.is_empty() {
            if s[at..].starts_with('{') {
                return at + list(&s[at..], &path, out);
            }
            out.insert(path);
            return at;
        }
        at += name.len();
        if name != "self" {
            path.push(name.to_owned());
        }
        if s[at..].starts_with("::") {
            at += 2;
        } else {
            out.insert(path);
            return at;
        }
    }
}

/// Reads the brace list at the start of `s` (`{a, b::c}`) below `prefix`; answers how many
/// bytes it took.
fn list(s: &str, prefix: &ModPath, out: &mut BTreeSet<ModPath>) -> usize {
    let mut at = 1;
    loop {
        at += s[at..].len() - s[at..].trim_start_matches([' ', '\n', ',']).len();
        match s[at..].chars().next() {
            None => return at,
            Some('}') => return at + 1,
            Some(_) => {
                // The tree, then anything up to the next item (` as name`).
                at += use_tree(&s[at..], prefix, out);
                at += s[at..].find([',', '}']).unwrap_or(s.len() - at);
            }
        }
    }
}

/// The paths into its own crate in `code`, the code of module `here`, made absolute:
/// `crate::…`, `super::…` and `self::…`, brace lists expanded (`crate::{a, b::{c, d}}` is
/// `a`, `b::c` and `b::d`).
fn imports(code: &str, here: &[String]) -> BTreeSet<ModPath> {
    let mut paths = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let boundary =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || b"_:".contains(&bytes[at - 1]));
        let base: Option<(ModPath, usize)> = if !boundary {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("self::") {
            Some((here.to_vec(), "self::".len()))
        } else if rest.starts_with("super::") {
            let (mut base, mut took) = (here.to_vec(), 0);
            while rest[took..].starts_with("super::") {
                base.pop();
                took += "super::".len();
            }
            Some((base, took))
        } else {
            None
        };
        match base {
            Some((base, took)) => at += took + use_tree(&rest[took..], &base, &mut paths),
            None => at += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    paths.retain(|p| !p.is_empty());
    paths
}

/// Code of a file without its comments and its test module.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module path of `file` below its crate's `src`: `a/b.rs` is `a::b`, `a/mod.rs` is
/// `a`, `lib.rs` is the root; none for a binary's files.
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let relative = file.strip_prefix(src).expect("below src");
    let mut path: ModPath = relative
        .iter()
        .map(|c| {
            c.to_str()
                .expect("a name")
                .trim_end_matches(".rs")
                .to_owned()
        })
        .collect();
    if path.first().is_some_and(|p| p == "bin") {
        return None;
    }
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    Some(path)
}

/// A module's graph: for each module inside it, the others there it imports from.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The graph of every module of the crate at `src` that has modules inside it (`a::b`
/// reaching `a::c::x` is an edge `b -> c` in the graph of `a`).
fn module_graphs(src: &Path) -> BTreeMap<ModPath, Graph> {
    let files: Vec<(ModPath, BTreeSet<ModPath>)> = sources(src)
        .into_iter()
        .filter_map(|file| {
            let here = module_of(src, &file)?;
            let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
            let found = imports(&code, &here);
            Some((here, found))
        })
        .collect();
    let mut graphs: BTreeMap<ModPath, Graph> = BTreeMap::new();
    for (module, _) in &files {
        for depth in 0..module.len() {
            graphs
                .entry(module[..depth].to_vec())
                .or_default()
                .entry(module[depth].clone())
                .or_default();
        }
    }
    for (module, found) in &files {
        for depth in 0..module.len() {
            let (parent, child) = (&module[..depth], &module[depth]);
            let graph = graphs.get_mut(parent).expect("made above");
            let reached: Vec<String> = found
                .iter()
                .filter(|p| p.len() > depth && p.starts_with(parent) && p[depth] != *child)
                .map(|p| p[depth].clone())
                .filter(|m| graph.contains_key(m))
                .collect();
            graph.get_mut(child).expect("made above").extend(reached);
        }
    }
    graphs
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
fn the_image_build_copies_every_workspace_member() {
    let dockerfile = std::fs::read_to_string(root().join("deploy/Dockerfile")).expect("Dockerfile");
    let copied: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for member in members() {
        assert!(
            copied
                .iter()
                .any(|c| member == *c || member.starts_with(&format!("{c}/"))),
            "deploy/Dockerfile copies no {member}"
        );
    }
}

#[test]
fn imports_between_the_modules_of_each_module_run_one_way() {
    // The reader itself: every form of import counts, made absolute.
    let path = |p: &str| -> ModPath { p.split("::").map(str::to_owned).collect() };
    let here = path("x::y");
    let found = imports(
        "use crate::{c as d, e::{F, self, g::H}};\nuse super::z::W; fn f() { self::q::r(); }",
        &here,
    );
    let expected: BTreeSet<ModPath> = ["c", "e::F", "e", "e::g::H", "x::z::W", "x::y::q::r"]
        .into_iter()
        .map(path)
        .collect();
    assert_eq!(found, expected);
    // A circle is found.
    let sample: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("e", "")]
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_owned(),
                v.split(' ')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        circle(&sample),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );

    let mut circles = Vec::new();
    // Each crate, and each binary of its own folder (`src/bin/x/`, whose `crate` is its
    // `main.rs`).
    let roots = crates().into_iter().flat_map(|src| {
        let bins = std::fs::read_dir(src.join("bin"))
            .into_iter()
            .flatten()
            .map(|entry| entry.expect("an entry").path())
            .filter(|path| path.is_dir());
        std::iter::once(src.clone()).chain(bins.collect::<Vec<_>>())
    });
    for src in roots {
        for (module, graph) in module_graphs(&src) {
            if let Some(found) = circle(&graph) {
                circles.push(format!(
                    "{} (in `crate::{}`): {}",
                    src.display(),
                    module.join("::"),
                    found.join(" -> ")
                ));
            }
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

#[test]
fn json_values_are_built_by_hand_only_in_the_openapi_builder() {
    let root = root();
    let allowed = root.join("services/api-gateway/src/openapi.rs");
    let mut found = Vec::new();
    for src in crates() {
        if src.starts_with(root.join("tests")) {
            continue;
        }
        for file in sources(&src) {
            if file == allowed || file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
            if code.contains("json!") {
                found.push(file.display().to_string());
            }
        }
    }
    assert!(
        found.is_empty(),
        "json! outside tests and the OpenAPI builder (use a typed struct):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cli_reads_answers_only_through_the_contracts_types() {
    // What the CLI may still deserialize itself: its own credentials file, and the error
    // body every route shares, read before it knows which answer it got.
    let own = ["Credentials", "ErrorBody"];
    let mut found = Vec::new();
    for file in sources(&root().join("cli/src")) {
        let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
        for (at, _) in code.match_indices("Deserialize") {
            let rest = &code[at..];
            let Some(decl) = ["struct ", "enum "]
                .iter()
                .filter_map(|k| rest.find(k).map(|i| i + k.len()))
                .min()
            else {
                continue;
            };
            let name = ident(rest[decl..].trim_start());
            let derived = code[..at]
                .rfind("#[derive(")
                .is_some_and(|d| !code[d..at].contains(')'));
            if derived && !own.contains(&name) {
                found.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the CLI declares answers of its own (use postmesh_contracts::answers):\n{}",
        found.join("\n")
    );
}

/// Most full-stack starts the tests may make: a new test of one service goes on its router
/// (`tests/src/routers.rs`), and a new flow of one key joins its file's side-by-side stack,
/// not a whole stack of its own.
const MAX_FULL_STACK_STARTS: usize = 60;

/// The functions at the top level of `text`: each one's name, whether it is a
/// `#[tokio::test]`, and its text up to the next function.
fn functions(text: &str) -> Vec<(&str, bool, &str)> {
    let starts: Vec<usize> = text
        .match_indices('\n')
        .map(|(at, _)| at + 1)
        .filter(|&at| {
            let line = &text[at..];
            ["fn ", "async fn ", "pub fn ", "pub async fn "]
                .iter()
                .any(|k| line.starts_with(k))
        })
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(i, &at)| {
            let end = starts.get(i + 1).copied().unwrap_or(text.len());
            let line = &text[at..];
            let name = ident(&line[line.find("fn ").expect("a function") + 3..]);
            let test = text[..at]
                .trim_end()
                .rsplit('\n')
                .next()
                .is_some_and(|attr| attr.starts_with("#[tokio::test"));
            (name, test, &text[at..end])
        })
        .collect()
}

/// The methods of `text`'s `impl` blocks that start a stack, as `Type::method`.
fn starting_methods(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("\nimpl ") {
        let block = &text[at + 1..];
        let block = &block[..block.find("\n}").unwrap_or(block.len())];
        let ty = ident(&block["impl ".len()..]);
        for method in block.split("\n    ").skip(1) {
            let method = method
                .trim_start_matches("pub ")
                .trim_start_matches("async ");
            if let Some(rest) = method.strip_prefix("fn ") {
                let start = block.find(method).expect("a method of the block");
                let end = block[start..]
                    .find("\n    }")
                    .map_or(block.len(), |e| start + e);
                if block[start..end].contains("Stack::start") {
                    found.push(format!("{ty}::{}", ident(rest)));
                }
            }
        }
    }
    found
}

/// How often `body` calls the function `name`.
fn calls(body: &str, name: &str) -> usize {
    body.match_indices(&format!("{name}("))
        .filter(|(at, _)| {
            !body[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .count()
}

#[test]
fn full_stack_starts_stay_within_their_ceiling() {
    let mut total = 0;
    let mut by_file = BTreeMap::new();
    for file in sources(&root().join("tests/tests")) {
        let text = code_of(&std::fs::read_to_string(&file).expect("readable"));
        let fns = functions(&text);
        // A helper of the file that starts a stack counts at each call, a method
        // (`World::start`) too.
        let mut helpers: Vec<String> = fns
            .iter()
            .filter(|(_, test, body)| !test && body.contains("Stack::start"))
            .map(|(name, ..)| name.to_string())
            .collect();
        helpers.extend(starting_methods(&text));
        let starts: usize = fns
            .iter()
            .filter(|(_, test, _)| *test)
            .map(|(_, _, body)| {
                calls(body, "Stack::start")
                    + calls(body, "Stack::start_with")
                    + calls(body, "Stack::start_opts")
                    + helpers.iter().map(|h| calls(body, h)).sum::<usize>()
            })
            .sum();
        if starts > 0 {
            by_file.insert(
                file.file_name().unwrap().to_string_lossy().into_owned(),
                starts,
            );
        }
        total += starts;
    }
    eprintln!("{total} full-stack starts: {by_file:?}");
    assert!(
        total <= MAX_FULL_STACK_STARTS,
        "{total} full-stack starts, more than {MAX_FULL_STACK_STARTS}: {by_file:?}"
    );
}
