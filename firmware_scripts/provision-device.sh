#!/usr/bin/env bash
# Install a board's bundle from `covey site init` and start its agent.
#   firmware_scripts/provision-device.sh BUNDLE_DIR DATA_PATH [TEST_PATH]
#
# BUNDLE_DIR is the board's folder DIR/devices/ID of the site (device.toml, ca.crt,
# password, and client.crt/client.key if issued). It is copied to /etc/covey (secrets
# 0600), device.toml gets the data, the test data and the state folder
# (/var/lib/covey/ID), and with systemd covey-device.service is installed, enabled and
# (re)started. Without systemd it prints the command that runs the agent.
#
# As root it installs system-wide; as another user it uses sudo, unless COVEY_PREFIX is
# set: then everything goes under that prefix ($COVEY_PREFIX/etc/covey,
# $COVEY_PREFIX/var/lib/covey), no root needed.
# Environment: COVEY_PREFIX (default: none, i.e. /), COVEY_DEVICE (the agent, default
# /opt/covey/venv/bin/covey-device as install-device.sh makes it), COVEY_SYSTEMD=yes|no
# (default: whether systemd runs), SYSTEMD_UNIT_DIR (default /etc/systemd/system).
set -euo pipefail
usage="usage: provision-device.sh BUNDLE_DIR DATA_PATH [TEST_PATH]"
fail() { echo "provision-device.sh: $*" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || fail "give the bundle folder and the data; $usage"
BUNDLE=$1; DATA=$2; TEST=${3:-}
[ -f "$BUNDLE/device.toml" ] || fail "$BUNDLE has no device.toml; give the board's bundle folder (DIR/devices/ID of the site)"
[ -e "$DATA" ] || fail "$DATA does not exist; give the board's training data (.npz, .csv or LEAF .json)"
[ -z "$TEST" ] || [ -e "$TEST" ] || fail "$TEST does not exist; give the board's test data, or leave it out"
command -v python3 >/dev/null || fail "python3 is missing (install-device.sh needs it too)"
toml() { python3 -c 'import json, os, sys; print(json.dumps(os.path.abspath(sys.argv[1])))' "$1"; }
ID=$(sed -n 's/^id = "\(.*\)"$/\1/p' "$BUNDLE/device.toml")
[ -n "$ID" ] || fail "$BUNDLE/device.toml names no id; make the bundle with covey site init"

PREFIX=${COVEY_PREFIX:-}
SUDO=""
if [ "$(id -u)" -ne 0 ] && [ -z "$PREFIX" ]; then SUDO=sudo; fi
ETC=$PREFIX/etc/covey
STATE=$PREFIX/var/lib/covey
AGENT=${COVEY_DEVICE:-/opt/covey/venv/bin/covey-device}
SYSTEMD=${COVEY_SYSTEMD:-$([ -d /run/systemd/system ] && echo yes || echo no)}
UNITS=${SYSTEMD_UNIT_DIR:-/etc/systemd/system}

umask 077
$SUDO mkdir -p "$ETC" "$STATE"
$SUDO chmod 0700 "$ETC"
$SUDO rm -f "$ETC/device.toml" "$ETC/ca.crt" "$ETC/password" "$ETC/client.crt" "$ETC/client.key"
for name in ca.crt client.crt; do
  [ ! -f "$BUNDLE/$name" ] || $SUDO install -m 0644 "$BUNDLE/$name" "$ETC/$name"
done
for name in password client.key; do
  [ ! -f "$BUNDLE/$name" ] || $SUDO install -m 0600 "$BUNDLE/$name" "$ETC/$name"
done
{
  cat "$BUNDLE/device.toml"
  echo "# added by provision-device.sh"
  echo "data = $(toml "$DATA")"
  [ -z "$TEST" ] || echo "test = $(toml "$TEST")"
  echo "state_dir = $(toml "$STATE/$ID")"
} | $SUDO tee "$ETC/device.toml" >/dev/null
$SUDO chmod 0644 "$ETC/device.toml"
echo "installed the bundle of $ID in $ETC"

if [ "$SYSTEMD" = yes ]; then
  HERE=$(cd "$(dirname "$0")" && pwd)
  sed -e "s#/opt/covey/venv/bin/covey-device#$AGENT#" -e "s#/etc/covey/device.toml#$ETC/device.toml#" \
    "$HERE/covey-device.service" | $SUDO tee "$UNITS/covey-device.service" >/dev/null
  $SUDO systemctl daemon-reload
  $SUDO systemctl enable covey-device
  $SUDO systemctl restart covey-device
  echo "covey-device runs (systemd); logs: journalctl -u covey-device -f"
else
  echo "no systemd here: run the agent with: $AGENT --config $ETC/device.toml -v"
fi
