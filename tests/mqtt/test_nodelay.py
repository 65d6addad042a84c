"""Small messages leave at once: covey's MQTT clients and brokers turn Nagle off.

Without TCP_NODELAY a probe, a request or an acknowledgement waited for the previous
segment's ACK, which the peer's delayed ACK holds back up to 40 ms: the first field test
measured 98 ms between two boards whose links add up to 8 ms (docs/results.md, "Measured
links")."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from device.mqtt import MqttLink
from server.broker import LOCAL_CONF

pytestmark = pytest.mark.broker


def test_the_client_socket_has_nagle_off(broker) -> None:  # type: ignore[no-untyped-def]
    link = MqttLink("nodelay-probe", broker.host, broker.port, clean_session=True)
    link.connect(10)
    try:
        sock = link._client.socket()
        assert sock is not None
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        link.close()


def test_every_broker_config_covey_writes_turns_nagle_off(site_parent: Path) -> None:
    from covey.cli import main
    from server.site import load_site

    assert "set_tcp_nodelay true" in LOCAL_CONF.read_text().splitlines()
    argv = ["site", "init", str(site_parent / "nd"), "--host", "localhost", "--ip", "127.0.0.1", "--devices", "b1"]
    assert main(argv) == 0
    assert "set_tcp_nodelay true" in load_site(site_parent / "nd").layout.broker_conf.read_text().splitlines()
