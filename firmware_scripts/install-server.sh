#!/usr/bin/env bash
# Install what a site's broker host and coordinator need, from a copy of this repository.
#   firmware_scripts/install-server.sh [PREFIX]
#
# PREFIX (default /opt/covey-server) gets a virtualenv, PREFIX/venv, with covey's server
# (grouping, coordinator, site tools: covey[server]) and TensorFlow to build the model the
# coordinator sends (covey[models]); mosquitto and python3-venv come from apt where
# missing (with sudo when not root). Nothing for development or tests: ./dev test sets up
# a checkout for those. Running the script again updates covey in place.
# Every refusal is one line on stderr and exit status 2, before anything is written.
set -euo pipefail
fail() { echo "install-server.sh: $*" >&2; exit 2; }
usage="usage: install-server.sh [PREFIX]"
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) fail "unknown option $1; $usage" ;;
esac
[ $# -le 1 ] || fail "one PREFIX only; $usage"
PREFIX=${1:-/opt/covey-server}
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || fail "$PY is missing; install Python >= 3.10 (apt install python3 python3-venv)"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || fail "covey needs Python >= 3.10"
SRC=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$SRC/pyproject.toml" ] || fail "$SRC is not a copy of the covey repository (no pyproject.toml)"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo

need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
"$PY" -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || fail "install ${need[*]} (no apt-get here), then run this again"
  echo "install-server.sh: installing ${need[*]} with apt" >&2
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null \
    || fail "apt could not install ${need[*]}; install them, then run this again"
fi

mkdir -p "$PREFIX" 2>/dev/null || { $SUDO mkdir -p "$PREFIX" && $SUDO chown "$(id -u):$(id -g)" "$PREFIX"; }
[ -x "$PREFIX/venv/bin/python" ] || "$PY" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install -q --upgrade pip
"$PREFIX/venv/bin/python" -m pip install -q "$SRC[server,models]"
echo "installed: $PREFIX/venv/bin/covey --help (coordinator, site and broker commands)"
