#!/usr/bin/env bash
# Write a device config and enable the systemd service.
#   firmware_scripts/provision-device.sh DEVICE_ID DATA_PATH [BROKER_HOST:PORT RUN]
# Without BROKER and RUN the agent finds the server with zeroconf.
set -euo pipefail
ID=$1; DATA=$2; BROKER=${3:-}; RUN=${4:-}
CONF=/etc/covey/device.toml
sudo mkdir -p /etc/covey /var/lib/covey
{
  echo "id = \"$ID\""
  echo "data = \"$DATA\""
  echo "state_dir = \"/var/lib/covey/$ID\""
  [ -n "$BROKER" ] && echo "broker = \"$BROKER\""
  [ -n "$RUN" ] && echo "run = \"$RUN\""
} | sudo tee "$CONF" >/dev/null
sudo cp "$(cd "$(dirname "$0")" && pwd)/covey-device.service" /etc/systemd/system/
sudo systemctl daemon-reload
sudo systemctl enable --now covey-device
echo "covey-device enabled; logs: journalctl -u covey-device -f"
