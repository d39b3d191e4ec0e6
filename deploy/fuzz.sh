#!/usr/bin/env bash
# `make fuzz`: every cargo-fuzz target of fuzz/ (one per parser of outside input) for
# FUZZ_SECS seconds each (default 60; FUZZ_SEED fixes libFuzzer's seed, so a run can be
# repeated), or only FUZZ_TARGETS. Each
# starts from its seeds (fuzz/seeds/<target>) and the corpus earlier runs grew
# (var/fuzz/corpus/<target>); a crash is kept in var/fuzz/artifacts/<target> and fails the
# run. cargo-fuzz is installed into a cache outside the checkout when missing; it runs on the
# stable toolchain (RUSTC_BOOTSTRAP=1 lets it pass its -Z flags) without a sanitizer
# (`-s none`: the code is safe Rust; libFuzzer's coverage guidance is what counts).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${FUZZ_SECS:-60}
tools="${POSTMESH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/postmesh-tools}"
export PATH="$tools/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz into $tools" >&2
  cargo install --locked --root "$tools" cargo-fuzz --version "${CARGO_FUZZ_VERSION:-0.13.2}" >&2
fi
export RUSTC_BOOTSTRAP=1
target_dir="${CARGO_TARGET_DIR:-$(deploy/cache-dir.sh)}"
export CARGO_TARGET_DIR="$target_dir/fuzz"

targets=${FUZZ_TARGETS:-$(cargo fuzz list)}
seed=()
[ -n "${FUZZ_SEED:-}" ] && seed=(-seed="$FUZZ_SEED")
for t in $targets; do
  mkdir -p "var/fuzz/corpus/$t" "var/fuzz/artifacts/$t"
  echo "fuzz: $t for ${secs}s" >&2
  cargo fuzz run -s none -O "$t" "var/fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=1048576 \
    -artifact_prefix="var/fuzz/artifacts/$t/" -print_final_stats=1 "${seed[@]}" 2>"var/fuzz/$t.log" \
    || { tail -n 40 "var/fuzz/$t.log" >&2; echo "fuzz: $t failed (var/fuzz/$t.log)" >&2; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "var/fuzz/$t.log" | sed "s/^/fuzz: $t /" >&2
done
