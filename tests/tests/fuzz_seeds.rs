//! Every fuzz target's seeds (`fuzz/seeds/<target>/`), and a fixed set of mutations of each,
//! replayed through the target's body (`postmesh-fuzz-bodies`) on every `make test`: the
//! targets compile, each has seeds, and no input panics or trips the target's assertions.
//! `make fuzz` is the coverage-guided fuzzing itself.

use std::path::{Path, PathBuf};

use postmesh_fuzz_bodies::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The names of the files in `dir` without their extension, sorted.
fn stems(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("directory entry").path();
            path.file_stem()
                .expect("a file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_target_of_the_fuzz_workspace_has_its_body_and_seeds() {
    let bodies: Vec<String> = TARGETS.iter().map(|(name, _)| (*name).to_owned()).collect();
    assert_eq!(stems(&fuzz_dir().join("fuzz_targets")), bodies);
    assert_eq!(stems(&fuzz_dir().join("seeds")), bodies);
    for name in &bodies {
        let path = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let target = std::fs::read_to_string(&path).expect("target readable");
        assert!(
            target.contains(&format!("postmesh_fuzz_bodies::{name}(data)")),
            "{} runs another body than {name}",
            path.display()
        );
    }
}

/// Mutations of each seed, the same on every run.
const MUTATIONS: usize = 2_000;

/// `seed` changed `round` times by a fixed pseudo-random walk: a byte flipped, one
/// inserted, a cut, or a slice repeated (deeper nesting, longer runs).
fn mutate(seed: &[u8], rounds: usize, state: &mut u64) -> Vec<u8> {
    let mut next = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state as usize
    };
    let mut data = seed.to_vec();
    for _ in 0..rounds {
        let at = if data.is_empty() {
            0
        } else {
            next() % data.len()
        };
        match next() % 4 {
            0 if !data.is_empty() => data[at] ^= 1 << (next() % 8),
            1 => data.insert(at, next() as u8),
            2 => data.truncate(at),
            _ => {
                let end = (at + 1 + next() % 64).min(data.len());
                let slice = data[at..end].to_vec();
                for _ in 0..1 + next() % 8 {
                    data.splice(at..at, slice.iter().copied());
                }
            }
        }
    }
    data
}

#[test]
fn every_seed_and_its_mutations_pass_their_fuzz_target() {
    for (name, body) in TARGETS {
        let dir = fuzz_dir().join("seeds").join(name);
        assert!(!stems(&dir).is_empty(), "{name} has no seeds");
        let mut state = 0x9e37_79b9_7f4a_7c15;
        for entry in std::fs::read_dir(&dir).expect("seeds") {
            let path = entry.expect("seed").path();
            let seed = std::fs::read(&path).expect("seed readable");
            for i in 0..=MUTATIONS {
                let data = mutate(&seed, i % 8, &mut state);
                let run = std::panic::catch_unwind(|| body(&data));
                assert!(
                    run.is_ok(),
                    "{name}: {} (mutation {i}) fails its target; input: {:?}",
                    path.display(),
                    String::from_utf8_lossy(&data)
                );
            }
        }
    }
}
