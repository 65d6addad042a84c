#!/data/data/com.termux/files/usr/bin/bash
# covey's device agent on Android, natively under Termux (no proot, no glibc userland).
#
# Termux's Python is built against Android's bionic libc, so pip finds no wheel of
# ai-edge-litert or tflite-runtime for it. Termux packages the interpreter itself:
# `python-tflite-runtime` in the main repository (termux-packages #21887, 2024), and
# `python3.12-tflite-runtime` in the Termux User Repository (TUR, pypi-wheel-builder
# #160) for Python 3.12. This script installs the first it finds, numpy from Termux
# (building it with pip needs a compiler), paho-mqtt and zeroconf from pip, and covey
# from a checkout without its pip dependencies (they are the ones just installed).
#
# Usage (in Termux):  bash firmware_scripts/termux-setup.sh [COVEY_CHECKOUT]
# It says at the end what it checked and what it could not.
set -euo pipefail
SRC=${1:-$(cd "$(dirname "$0")/.." && pwd)}
checked=()
missing=()

if [ -z "${PREFIX:-}" ] || [ ! -d "$PREFIX" ] || ! command -v pkg >/dev/null 2>&1; then
  echo "termux-setup.sh: this is not Termux (no \$PREFIX or pkg); on Linux boards use install-device.sh" >&2
  exit 2
fi
[ -f "$SRC/pyproject.toml" ] || { echo "termux-setup.sh: $SRC is not a covey checkout" >&2; exit 2; }

pkg update -y
pkg install -y python python-numpy
if pkg install -y python-tflite-runtime; then
  checked+=("tflite-runtime from Termux's main repository (python-tflite-runtime)")
else
  pkg install -y tur-repo
  pkg update -y
  if pkg install -y python3.12-tflite-runtime; then
    checked+=("tflite-runtime from TUR (python3.12-tflite-runtime)")
  else
    missing+=("no tflite-runtime package: neither python-tflite-runtime nor TUR's python3.12-tflite-runtime installed")
  fi
fi
pip install --upgrade "paho-mqtt>=2.0" "zeroconf>=0.131"
pip install --no-deps "$SRC"

if python -c "import tflite_runtime.interpreter as t; t.Interpreter" 2>/dev/null; then
  checked+=("python can load the LiteRT interpreter (tflite_runtime)")
else
  missing+=("python cannot import tflite_runtime.interpreter: covey-device cannot train here")
fi
if command -v covey-device >/dev/null 2>&1 && covey-device --help >/dev/null 2>&1; then
  checked+=("covey-device runs")
else
  missing+=("covey-device is not on PATH after pip install")
fi

# Wi-Fi readings for link measurement (docs/links.md): termux-api's
# termux-wifi-connectioninfo gives the RSSI (no noise floor, so no SNR).
if command -v termux-wifi-connectioninfo >/dev/null 2>&1; then
  if timeout 10 termux-wifi-connectioninfo | grep -q '"rssi"'; then
    checked+=("Wi-Fi signal from termux-api (termux-wifi-connectioninfo)")
  else
    missing+=("termux-wifi-connectioninfo gave no RSSI: install the Termux:API app and grant it location access")
  fi
else
  missing+=("no Wi-Fi readings: 'pkg install termux-api' and the Termux:API app give the signal (not the noise)")
fi

echo
echo "checked:"
for item in "${checked[@]}"; do echo "  ok   $item"; done
if [ ${#missing[@]} -gt 0 ]; then
  echo "could not:"
  for item in "${missing[@]}"; do echo "  --   $item"; done
fi
echo "next: covey-device --measure-link, then covey-device --config device.toml (a site bundle's)"
