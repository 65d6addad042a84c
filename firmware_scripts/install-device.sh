#!/usr/bin/env bash
# Install the covey device agent on a 64-bit Linux board (Raspberry Pi OS Bookworm 64-bit,
# Ubuntu/Debian aarch64, Jetson). No TensorFlow: numpy, paho-mqtt, ai-edge-litert, zeroconf.
#   firmware_scripts/install-device.sh [/opt/covey]
set -euo pipefail
PREFIX=${1:-/opt/covey}
PY=${PYTHON:-python3}
arch=$(uname -m)
case "$arch" in
  aarch64|x86_64) ;;
  *) echo "covey needs a 64-bit OS (aarch64 or x86_64); LiteRT has no wheels for $arch" >&2; exit 2 ;;
esac
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || { echo "covey needs Python >= 3.10" >&2; exit 2; }
SRC=$(cd "$(dirname "$0")/.." && pwd)
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
mkdir -p "$PREFIX" 2>/dev/null || { $SUDO mkdir -p "$PREFIX" && $SUDO chown "$(id -u):$(id -g)" "$PREFIX"; }
"$PY" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install -q --upgrade pip
"$PREFIX/venv/bin/pip" install -q "$SRC[device]"
echo "installed: $PREFIX/venv/bin/covey-device --help"
