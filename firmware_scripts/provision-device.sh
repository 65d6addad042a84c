#!/usr/bin/env bash
# Install a board's bundle from `covey site init` and start its agent.
#   firmware_scripts/provision-device.sh [--prefix DIR] [--user WRITER] BUNDLE_DIR DATA_PATH [TEST_PATH]
#
# BUNDLE_DIR is the board's folder DIR/devices/ID of the site (device.toml, ca.crt,
# password, and client.crt/client.key if issued). It is copied to /etc/covey (secrets
# 0600), device.toml gets the data, the test data and the state folder
# (/var/lib/covey/ID), and with systemd covey-device.service is installed, enabled and
# (re)started. Without systemd it prints the command that runs the agent.
#
# --prefix DIR puts everything under DIR instead (DIR/etc/covey, DIR/var/lib/covey): no
#   root needed, and several boards can share one machine for a trial, each with its own
#   DIR (docs/site-guide.md, "A trial on one machine"). Without it, as root it installs
#   system-wide and as another user it uses sudo.
# --user WRITER picks the writer of a LEAF .json file that holds several (the script
#   lists them when it is missing); .npz and .csv files hold one board's data.
# Environment: COVEY_PREFIX (as --prefix), COVEY_DEVICE (the agent, default
# /opt/covey/venv/bin/covey-device as install-device.sh makes it), COVEY_SYSTEMD=yes|no
# (default: whether systemd runs, and no under a prefix), SYSTEMD_UNIT_DIR (default
# /etc/systemd/system).
set -euo pipefail
usage="usage: provision-device.sh [--prefix DIR] [--user WRITER] BUNDLE_DIR DATA_PATH [TEST_PATH]"
fail() { echo "provision-device.sh: $*" >&2; exit 2; }
PREFIX=${COVEY_PREFIX:-}
WRITER=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || fail "--prefix needs a folder; $usage"; PREFIX=$2; shift 2 ;;
    --user) [ $# -ge 2 ] || fail "--user needs a writer id; $usage"; WRITER=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) fail "unknown option $1; $usage" ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] && [ $# -le 3 ] || fail "give the bundle folder and the data; $usage"
BUNDLE=$1; DATA=$2; TEST=${3:-}
[ -f "$BUNDLE/device.toml" ] || fail "$BUNDLE has no device.toml; give the board's bundle folder (DIR/devices/ID of the site)"
[ -e "$DATA" ] || fail "$DATA does not exist; give the board's training data (.npz, .csv or LEAF .json)"
[ -z "$TEST" ] || [ -e "$TEST" ] || fail "$TEST does not exist; give the board's test data, or leave it out"
command -v python3 >/dev/null || fail "python3 is missing (install-device.sh needs it too)"
toml() { python3 -c 'import json, os, sys; print(json.dumps(os.path.abspath(sys.argv[1])))' "$1"; }
[ -z "$PREFIX" ] || PREFIX=$(python3 -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "$PREFIX")
ID=$(sed -n 's/^id = "\(.*\)"$/\1/p' "$BUNDLE/device.toml")
[ -n "$ID" ] || fail "$BUNDLE/device.toml names no id; make the bundle with covey site init"
case "$DATA" in
  *.json)  # a LEAF file: the agent needs one writer; say which ones there are before installing
    why=$(python3 - "$DATA" "$WRITER" <<'PY'
import json, sys
path, writer = sys.argv[1], sys.argv[2]
try:
    users = [str(u) for u in json.load(open(path))["users"]]
except (OSError, ValueError, KeyError, TypeError) as exc:
    print(f"{path} is not a LEAF file ({exc})")
    sys.exit(0)
listed = ", ".join(users[:12]) + (f" and {len(users) - 12} more" if len(users) > 12 else "")
if writer and writer not in users:
    print(f"writer {writer!r} is not in {path}, which holds {listed}")
elif not writer and len(users) != 1:
    print(f"{path} holds {len(users)} writers ({listed}); choose one with --user WRITER")
PY
)
    [ -z "$why" ] || fail "$why" ;;
  *) [ -z "$WRITER" ] || fail "--user picks a writer of a LEAF .json file; $DATA is one board's data already" ;;
esac

SUDO=""
if [ "$(id -u)" -ne 0 ] && [ -z "$PREFIX" ]; then SUDO=sudo; fi
ETC=$PREFIX/etc/covey
STATE=$PREFIX/var/lib/covey
AGENT=${COVEY_DEVICE:-/opt/covey/venv/bin/covey-device}
# under a prefix (a trial, several boards on one machine) no service is installed unless asked
SYSTEMD=${COVEY_SYSTEMD:-$([ -z "$PREFIX" ] && [ -d /run/systemd/system ] && echo yes || echo no)}
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
  [ -z "$WRITER" ] || echo "user = $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$WRITER")"
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
