#!/usr/bin/env bash
# A mosquitto broker for a covey site: TLS with a private CA, passwords, per-device ACLs.
#   firmware_scripts/broker-setup.sh RUN DEVICE_ID [DEVICE_ID ...]
# Writes /etc/mosquitto/covey/ and conf.d/covey.conf from covey-site.conf.
set -euo pipefail
RUN=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=/etc/mosquitto/covey
sudo apt-get install -y -qq mosquitto openssl >/dev/null
sudo mkdir -p "$DIR"
cd "$DIR"
if [ ! -f ca.key ]; then
  sudo openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=covey-ca" -keyout ca.key -out ca.crt
  sudo openssl req -newkey rsa:3072 -nodes -subj "/CN=$(hostname)" -keyout broker.key -out broker.csr
  sudo openssl x509 -req -in broker.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out broker.crt
fi
sudo touch passwords
{
  echo "# the coordinator"
  echo "user server"
  echo "topic readwrite covey/$RUN/#"
  for id in "$@"; do
    # protocol 2 (docs/protocol.md): a device writes only topics that carry its id
    echo "user $id"
    echo "topic read covey/$RUN/device/$id/#"
    echo "topic read covey/$RUN/artifact/#"
    echo "topic read covey/$RUN/shared/#"
    echo "topic read covey/$RUN/server/status"
    echo "topic write covey/$RUN/from/$id/#"
    echo "topic write covey/$RUN/device/+/frames/from/$id"
  done
} | sudo tee acl >/dev/null
for user in server "$@"; do
  pass=$(openssl rand -hex 12)
  sudo mosquitto_passwd -b passwords "$user" "$pass"
  echo "$user $pass"
done | sudo tee credentials.txt >/dev/null
sudo chmod 600 credentials.txt ca.key broker.key
sudo cp "$HERE/mosquitto/covey-site.conf" /etc/mosquitto/conf.d/covey.conf
sudo systemctl restart mosquitto
echo "broker ready on :8883; credentials in $DIR/credentials.txt, CA for devices: $DIR/ca.crt"
