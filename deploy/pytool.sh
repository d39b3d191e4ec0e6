# Sourced by the check scripts: `pytool <venv dir> <package> <version>` makes sure the
# venv holds that version of a PyPI tool (creating the venv, and installing python3-venv
# with apt when root and it is missing). Its commands are then in `<venv dir>/bin`.
pytool() {
  local venv="$1" package="$2" version="$3"
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
