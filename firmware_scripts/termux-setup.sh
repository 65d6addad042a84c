#!/data/data/com.termux/files/usr/bin/bash
# Android under Termux. Termux's Python is built against Android's bionic libc, and
# neither ai-edge-litert nor tflite-runtime publishes wheels for it, so pip cannot
# install an interpreter there. Two routes work:
#   1. proot-distro with a Debian/Ubuntu aarch64 userland (glibc): run install-device.sh
#      inside it, exactly as on a Raspberry Pi;
#   2. a LiteRT interpreter built for Termux, then `pip install paho-mqtt zeroconf numpy`
#      and covey with --no-deps.
set -euo pipefail
pkg install -y proot-distro
proot-distro install debian
echo "now: proot-distro login debian -- bash -c 'apt-get update && apt-get install -y python3-venv git && \
  git clone <your covey checkout> covey && covey/firmware_scripts/install-device.sh \$HOME/covey-venv'"
