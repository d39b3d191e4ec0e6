#!/usr/bin/env bash
# Prints the cargo target directory .ci/run builds in: outside the checkout, keyed by the
# toolchain and Cargo.lock, so a clean clone reuses the dependencies an earlier run compiled.
# A new key starts from the newest earlier directory (moved, not copied: cargo keeps what
# still matches and rebuilds the rest); only that one directory is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${POSTMESH_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/postmesh-target}"
key="$( { rustc -vV; cat Cargo.lock; } | sha256sum | cut -c1-16)"
dir="$root/$key"
mkdir -p "$root"
if [ ! -d "$dir" ]; then
  newest="$(ls -1dt "$root"/*/ 2>/dev/null | head -n1 || true)"
  if [ -n "$newest" ]; then mv "${newest%/}" "$dir"; else mkdir -p "$dir"; fi
fi
for old in "$root"/*/; do
  [ "${old%/}" = "$dir" ] || rm -rf "${old%/}"
done
echo "$dir"
