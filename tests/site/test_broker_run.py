"""``covey broker run --site DIR``: the site's mosquitto in the foreground.

It serves the site's TLS listener, takes a device added with ``covey site add-device``
after a SIGHUP (the reload systemd does), stops with status 0 on SIGTERM, and refuses
to start on a port already in use with one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from device.errors import TransportError
from server.broker import BrokerHandle, wait_for_port
from tests.covey.test_cli_mistakes import assert_one_line_error, covey
from tests.site.conftest import SiteBroker, init

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.broker


def broker_run(site: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "covey.cli", "broker", "run", "--site", str(site)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_broker_run_serves_the_site_and_reloads_on_sighup(site_parent: Path, tmp_path: Path) -> None:
    # Prepare
    site = init(site_parent / "site", "d1")
    proc = broker_run(site.layout.root, tmp_path / "broker.log")
    try:
        wait_for_port("127.0.0.1", site.spec.port, 15, proc)
        broker = SiteBroker(site, BrokerHandle("127.0.0.1", site.spec.port, "mosquitto"))
        assert broker.connected("d1").connected

        # Execute: a new board, then the reload
        assert covey("site", "add-device", str(site.layout.root), "d2").returncode == 0
        with pytest.raises(TransportError, match="refused"):
            broker.link("d2").connect(10)  # not yet: the broker has the old password file
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        accepted = False
        while not accepted and time.monotonic() < deadline:
            try:
                accepted = broker.connected("d2").connected
            except TransportError:
                time.sleep(0.2)
        # a board writes 300 times where the ACL forbids it (another board's inbox)
        d1 = broker.links[0]
        for i in range(300):
            d1.publish("covey/siterun/device/d2/inbox", str(i).encode(), wait=5)
        for link in broker.links:
            link.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(15)

    # Assert
    assert accepted, "d2 was not accepted after the reload"
    log = (tmp_path / "broker.log").read_text()
    assert status == 0, log
    assert "Ctrl-C stops it" in log
    # the refusals are visible, once and then counted, without mosquitto's packet trace
    refused = [line for line in log.splitlines() if "the ACL refused" in line]
    assert (
        refused[0]
        == "mosquitto: the ACL refused a PUBLISH by d1 to 'covey/siterun/device/d2/inbox' (further refusals counted)"
    )
    assert sum(int(line.split(" refused ")[1].split(" more")[0].replace(",", "")) for line in refused[1:]) == 299
    assert "Received PUBLISH" not in log and "Sending PUBACK" not in log


def test_broker_run_on_a_port_in_use_is_one_line(site_parent: Path, tmp_path: Path) -> None:
    import socket

    site = init(site_parent / "site", "d1")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", site.spec.port))
        taken.listen()
        proc = covey("broker", "run", "--site", str(site.layout.root))
    assert_one_line_error(proc, f"port {site.spec.port} is in use", "--port")


@pytest.mark.parametrize("to_group", [True, False], ids=["ctrl-c in its terminal", "kill -INT of covey alone"])
def test_an_interrupt_stops_mosquitto_too(site_parent: Path, tmp_path: Path, to_group: bool) -> None:
    """Ctrl-C reaches mosquitto with covey (one process group); ``kill -INT`` reaches covey
    alone, which must then stop mosquitto itself instead of leaving it running."""
    # Prepare
    site = init(site_parent / "site", "d1")
    with (tmp_path / "broker.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "covey.cli", "broker", "run", "--site", str(site.layout.root)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_port("127.0.0.1", site.spec.port, 15, proc)

        # Execute
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        proc.wait(30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _listening(site.spec.port):
            time.sleep(0.1)

        # Assert: nothing listens on the site's port any more
        assert not _listening(site.spec.port), (tmp_path / "broker.log").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
