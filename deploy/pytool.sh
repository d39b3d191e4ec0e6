# Sourced by the check scripts: `pytool <package> <version>` makes sure a venv in the tools
# cache outside the checkout (POSTMESH_TOOLS, as deploy/fuzz.sh's cargo-fuzz) holds that
# version of a PyPI tool (creating the venv, and installing python3-venv with apt when root
# and it is missing), so a clean clone does not reinstall it. It sets PYTOOL_BIN to the
# venv's `bin` directory, where the tool's commands are.
pytool() {
  local package="$1" version="$2"
  local venv="${POSTMESH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/postmesh-tools}/venv-$package"
  PYTOOL_BIN="$venv/bin"
  if [ -x "$venv/bin/pip" ] &&
    [ "$("$venv/bin/pip" show "$package" 2>/dev/null | sed -n 's/^Version: //p')" = "$version" ]; then
    return 0
  fi
  if ! python3 -m venv --help >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      echo "python3's venv module is missing; install the Debian package python3-venv (or run as root)" >&2
      exit 1
    fi
    echo "installing python3-venv" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
  fi
  mkdir -p "$(dirname "$venv")"
  echo "installing $package $version into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$package==$version" >&2
}
