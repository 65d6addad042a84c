#!/usr/bin/env sh
# What this board's agent would report about its link, for debugging a site:
# the Wi-Fi interface, signal, noise and SNR and where each came from
# (/proc/net/wireless, `iw`, or Termux's termux-wifi-connectioninfo), or
# "not available" where the platform says nothing. RTT and goodput need the
# coordinator: `covey links STATE_DIR` on the server shows what the run measured.
# Usage: firmware_scripts/measure-link.sh [PREFIX]   (covey-device from PATH, else PREFIX,
#        default /opt/covey as install-device.sh uses)
set -eu
if command -v covey-device >/dev/null 2>&1; then
  exec covey-device --measure-link
elif [ -x "${1:-/opt/covey}/venv/bin/covey-device" ]; then
  exec "${1:-/opt/covey}/venv/bin/covey-device" --measure-link
fi
echo "measure-link.sh: covey-device is not installed here (firmware_scripts/install-device.sh installs it)" >&2
exit 2
