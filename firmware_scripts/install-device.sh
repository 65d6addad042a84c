#!/usr/bin/env bash
# Install the covey device agent on a Linux board, from a copy of this repository.
#   firmware_scripts/install-device.sh [--backend litert|tflite-runtime] [PREFIX]
#
# PREFIX (default /opt/covey) gets a virtualenv, PREFIX/venv, with covey's agent and one
# interpreter backend. No TensorFlow. Running the script again updates covey in place.
#
#   64-bit (aarch64, x86_64): Raspberry Pi OS 64-bit, Debian/Ubuntu arm64, Jetson.
#       Default backend LiteRT (ai-edge-litert, numpy 2; CPython 3.10-3.14), the extra
#       covey[device]. --backend tflite-runtime takes tflite-runtime 2.14 with numpy < 2
#       instead (covey[device-tflite]; CPython 3.9-3.11).
#   32-bit (armv7l): Raspberry Pi OS 32-bit (bookworm), Debian armhf. LiteRT has no
#       armv7l wheels and PyPI has no armv7l numpy, so the backend is tflite-runtime 2.14
#       (it ships a cp311 armv7l wheel) over Debian's python3-numpy, in a venv that sees
#       the system's packages. python3-numpy and python3-venv come from apt if missing.
#   armv6l (Pi 1, Pi Zero) and other architectures: no interpreter wheel exists; refused.
#
# Every refusal is one line on stderr and exit status 2, before anything is written.
set -euo pipefail
fail() { echo "install-device.sh: $*" >&2; exit 2; }
usage="usage: install-device.sh [--backend litert|tflite-runtime] [PREFIX]"
BACKEND=""
PREFIX=""
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) [ $# -ge 2 ] || fail "--backend needs litert or tflite-runtime; $usage"; BACKEND=$2; shift 2 ;;
    --backend=*) BACKEND=${1#--backend=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) fail "unknown option $1; $usage" ;;
    *) [ -z "$PREFIX" ] || fail "one PREFIX only; $usage"; PREFIX=$1; shift ;;
  esac
done
PREFIX=${PREFIX:-/opt/covey}
PY=${PYTHON:-python3}
arch=$(uname -m)
command -v "$PY" >/dev/null || fail "$PY is missing; install Python >= 3.10 (apt install python3 python3-venv)"
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || fail "covey needs Python >= 3.10; this is $pyver"

case "$arch" in
  aarch64|arm64|x86_64) BACKEND=${BACKEND:-litert} ;;
  armv7l|armv8l)
    [ "$BACKEND" != litert ] || fail "LiteRT has no wheels for $arch (32-bit ARM); use --backend tflite-runtime, or a 64-bit OS"
    BACKEND=tflite-runtime ;;
  armv6l) fail "no TFLite interpreter has wheels for armv6l (Pi 1, Pi Zero); use a Pi with a 64-bit or 32-bit ARMv7 OS" ;;
  *) fail "no TFLite interpreter has wheels for $arch; covey boards are aarch64, x86_64 or armv7l" ;;
esac
case "$BACKEND" in
  litert) extra=device ;;
  tflite-runtime)
    extra=device-tflite
    "$PY" -c 'import sys; sys.exit(0 if sys.version_info < (3, 12) else 1)' \
      || fail "tflite-runtime 2.14 has wheels for Python 3.9-3.11 only; this is $pyver (use --backend litert on 64-bit)" ;;
  *) fail "unknown backend '$BACKEND'; choose litert or tflite-runtime" ;;
esac

SRC=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$SRC/pyproject.toml" ] || fail "$SRC is not a copy of the covey repository (no pyproject.toml)"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo

venv_args=()
if [ "$arch" = armv7l ] || [ "$arch" = armv8l ]; then
  # numpy from Debian: PyPI has no armv7l wheel and building it on a Pi takes an hour
  need=()
  "$PY" -c 'import numpy' 2>/dev/null || need+=(python3-numpy)
  "$PY" -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
  if [ ${#need[@]} -gt 0 ]; then
    echo "install-device.sh: installing ${need[*]} with apt" >&2
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null \
      || fail "apt could not install ${need[*]}; install them, then run this again"
  fi
  "$PY" -c 'import numpy, sys; sys.exit(0 if int(numpy.__version__.split(".")[0]) < 2 else 1)' \
    || fail "tflite-runtime 2.14 needs numpy < 2, and the system's numpy is newer"
  venv_args+=(--system-site-packages)
fi

mkdir -p "$PREFIX" 2>/dev/null || { $SUDO mkdir -p "$PREFIX" && $SUDO chown "$(id -u):$(id -g)" "$PREFIX"; }
[ -x "$PREFIX/venv/bin/python" ] || "$PY" -m venv "${venv_args[@]}" "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install -q --upgrade pip
# pip reinstalls covey from a folder every time, so running this again updates the board
"$PREFIX/venv/bin/python" -m pip install -q "$SRC[$extra]"
version=$("$PREFIX/venv/bin/covey-device" --version 2>/dev/null || true)
echo "installed: $PREFIX/venv/bin/covey-device --help (${version:-covey}, $BACKEND, $arch)"
