#!/usr/bin/env bash
# The site's broker: `covey site init`, then mosquitto as the system service when systemd runs.
#   firmware_scripts/broker-setup.sh DIR --host NAME [--ip ADDR ...] --devices ID [ID ...] [site init options]
#
# With systemd: makes the site in DIR as root (sudo when you are not root), so mosquitto's
# files are group-owned by mosquitto (0640) and its sessions persist in /var/lib/mosquitto;
# run through sudo, the bundles and the coordinator's credentials in DIR belong to you.
# DIR must be a folder the mosquitto user can enter (e.g. /etc/mosquitto/covey). It then
# installs DIR/broker/mosquitto.conf as /etc/mosquitto/conf.d/covey.conf and restarts
# mosquitto. Without systemd: makes the site as you and says how to run the broker
# (`covey broker run --site DIR`). Installs mosquitto with apt if it is missing.
#
# Environment: COVEY (the covey command, default: on PATH, else this checkout's .venv),
# COVEY_SYSTEMD=yes|no (default: whether systemd runs), MOSQUITTO_CONF_D (default
# /etc/mosquitto/conf.d).
set -euo pipefail
usage="usage: broker-setup.sh DIR --host NAME [--ip ADDR ...] --devices ID [ID ...]"
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { echo "broker-setup.sh: give the site folder first; $usage" >&2; exit 2; }
DIR=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
COVEY=${COVEY:-$(command -v covey || echo "$HERE/../.venv/bin/covey")}
[ -x "$COVEY" ] || { echo "broker-setup.sh: no covey at $COVEY; install covey[server] and set COVEY=/path/to/covey" >&2; exit 2; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
SYSTEMD=${COVEY_SYSTEMD:-$([ -d /run/systemd/system ] && echo yes || echo no)}
CONF_D=${MOSQUITTO_CONF_D:-/etc/mosquitto/conf.d}

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  echo "broker-setup.sh: installing mosquitto with apt" >&2
  $SUDO apt-get install -y -qq mosquitto >/dev/null
fi

if [ "$SYSTEMD" = yes ]; then
  $SUDO "$COVEY" site init "$DIR" --system "$@"
  $SUDO mkdir -p "$CONF_D"
  $SUDO install -m 0644 "$DIR/broker/mosquitto.conf" "$CONF_D/covey.conf"
  $SUDO systemctl restart mosquitto
  $SUDO systemctl is-active --quiet mosquitto \
    || { echo "broker-setup.sh: mosquitto did not start; see journalctl -u mosquitto" >&2; exit 1; }
  echo "mosquitto runs the site (systemd): $CONF_D/covey.conf; logs: journalctl -u mosquitto"
else
  "$COVEY" site init "$DIR" "$@"
  echo "no systemd here: run the broker with: $COVEY broker run --site $DIR"
fi
