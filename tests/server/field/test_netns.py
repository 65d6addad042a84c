"""The virtual LAN: hosts in their own network namespaces talk over a bridge, links are
shaped with tbf, and everything the lab made is gone afterwards, even after a failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.field.fieldtest import TrafficMeter
from server.field.netns import Lab, available, leftovers

REPO = Path(__file__).resolve().parents[3]
OK, WHY = available()
pytestmark = pytest.mark.skipif(not OK, reason=f"network namespaces unavailable here: {WHY}")

SERVER = "import socket; s = socket.create_server(('{ip}', 9000)); c, _ = s.accept(); print(c.recv(16).decode())"
CLIENT = "import socket, time\n" + (
    "for _ in range(50):\n"
    "    try:\n"
    "        c = socket.create_connection(('{ip}', 9000), timeout=2); break\n"
    "    except OSError: time.sleep(0.1)\n"
    "c.sendall(b'across the lan')\n"
)


def test_hosts_reach_each_other_over_the_bridge_and_links_are_shaped(tmp_path) -> None:
    with Lab() as lab:
        # Prepare
        a, b = lab.add_host("a"), lab.add_host("b")
        lab.shape(b, 20)

        # Execute
        server = lab.start(b, [sys.executable, "-c", SERVER.format(ip=b.ip)], log=tmp_path / "server.log")
        client = lab.run(a, [sys.executable, "-c", CLIENT.format(ip=b.ip)])
        server.wait(10)
        qdisc = lab.run(b, ["tc", "qdisc", "show", "dev", "eth0"]).stdout

        # Assert
        assert client.returncode == 0, client.stderr
        assert (tmp_path / "server.log").read_text().strip() == "across the lan"
        assert "tbf" in qdisc and "rate 20Mbit" in qdisc
        # the machine's own namespace has no address or route in the lab's network
        mine = [
            subprocess.run(["ip", *cmd], capture_output=True, text=True, check=True).stdout
            for cmd in (["-o", "addr", "show"], ["route", "show", "table", "all"])
        ]
        assert all("10.77.0." not in text for text in mine), mine
    assert not [n for n in leftovers() if lab.tag in n]


def test_a_room_behind_a_gateway_reaches_the_gateway_only(tmp_path) -> None:
    with Lab() as lab:
        # Prepare: the main network holds the broker and the gateway; the room, a board
        broker, gateway = lab.add_host("broker"), lab.add_host("gw")
        board = lab.add_host("board", network=3)
        inside = lab.attach(gateway, 3)

        # Execute
        server = lab.start(gateway, [sys.executable, "-c", SERVER.format(ip=inside)], log=tmp_path / "gw.log")
        to_gateway = lab.run(board, [sys.executable, "-c", CLIENT.format(ip=inside)])
        server.wait(10)
        to_broker = lab.run(board, ["python3", "-c", f"import socket; socket.create_connection(('{broker.ip}', 9), 1)"])
        addresses = lab.run(gateway, ["ip", "-o", "-4", "addr", "show"]).stdout

        # Assert
        assert (board.ip, inside, gateway.ip) == ("10.77.3.1", "10.77.3.2", "10.77.0.2")
        assert to_gateway.returncode == 0, to_gateway.stderr
        assert (tmp_path / "gw.log").read_text().strip() == "across the lan"
        assert to_broker.returncode != 0 and "unreachable" in to_broker.stderr.lower(), to_broker.stderr
        assert "eth0" in addresses and "eth1" in addresses and gateway.addresses == {0: gateway.ip, 3: inside}
    assert not [n for n in leftovers() if lab.tag in n]


def test_the_lab_is_removed_when_the_test_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), Lab() as lab:
        lab.add_host("x")
        raise RuntimeError("boom")
    assert not [n for n in leftovers() if lab.tag in n]


STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
CLOSER = """
import sys, time
from pathlib import Path
from server.field.netns import Lab
class Announced(Lab):
    def _close(self) -> None:  # inside close(): say so, then clean up
        print(self.tag, flush=True)
        super()._close()

lab = Announced()
host = lab.add_host("x")
lab.start(host, [sys.executable, "-c", {stubborn!r}], log=Path({log!r}))
deadline = time.monotonic() + 30
while "up" not in Path({log!r}).read_text():
    assert time.monotonic() < deadline, "the stubborn process did not start"
    time.sleep(0.05)
try:
    lab.close()  # waits 10 s for the process that ignores SIGTERM, then kills it
finally:
    print("closed", flush=True)
"""


@pytest.mark.slow
def test_a_second_interrupt_during_cleanup_still_removes_the_lab(tmp_path) -> None:
    # Prepare: a lab whose cleanup takes a while (a process that ignores SIGTERM)
    log = tmp_path / "stubborn.log"
    log.write_text("")
    code = CLOSER.format(stubborn=STUBBORN, log=str(log))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    tag = proc.stdout.readline().strip()
    assert tag and [n for n in leftovers() if tag in n], "the lab was not built"

    # Execute: Ctrl-C while it cleans up (it printed its tag from inside close())
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]

    # Assert: the cleanup finished first; the interrupt came after it
    assert "closed" in rest and proc.returncode != 0
    assert not [n for n in leftovers() if tag in n], leftovers()


SINK = (
    "import socket\n"
    "s = socket.create_server(('{ip}', 9000))\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    while c.recv(1 << 16): pass\n"
    "    c.close()\n"
)
SEND = "import socket\nc = socket.create_connection(('{ip}', 9000), timeout=10)\nc.sendall(bytes({n}))\nc.close()\n"


def _rounds(path: Path, n: int) -> None:
    """A coordinator's results.json with ``n`` rounds, replaced whole as the coordinator does."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rounds": [{"round": k + 1} for k in range(n)]}))
    tmp.replace(path)


def test_the_traffic_meter_puts_each_round_s_bytes_on_the_links_that_carried_them(tmp_path) -> None:
    with Lab() as lab:
        # Prepare: a broker host that swallows what it gets, a silent server, two devices
        broker, _server = lab.add_host("broker"), lab.add_host("server")
        d1, d2 = lab.add_host("d001"), lab.add_host("d002")
        lab.start(broker, [sys.executable, "-c", SINK.format(ip=broker.ip)])
        lab.wait_for_port(d1, broker.ip, 9000)
        results = tmp_path / "results.json"
        meter = TrafficMeter(lab, results, ["d001", "d002"], interval=3600)  # polled by hand below

        # Execute: round 1, d001 sends 1 MB; round 2, d002 sends 2 MB
        for host, n, rnd in ((d1, 1_000_000, 1), (d2, 2_000_000, 2)):
            sent = lab.run(host, [sys.executable, "-c", SEND.format(ip=broker.ip, n=n)])
            assert sent.returncode == 0, sent.stderr
            _rounds(results, rnd)
            meter.poll()
        traffic = meter.stop()

    # Assert: the payload and its TCP/IP framing, on the right link and round. Framing is
    # about 5 %; under the whole suite (2026-11-27) a round read 11.2 %, as a starved
    # receiver drops and TCP sends again, so the bound is 25 % (the other round's bytes
    # would be 100 % or more)
    assert len(traffic.devices) == len(traffic.coordinator) == len(traffic.broker) == 2
    for rnd, n in enumerate((1_000_000, 2_000_000)):
        assert n <= traffic.devices[rnd].up < 1.25 * n, traffic
        assert n <= traffic.broker[rnd].down < 1.25 * n, traffic
        assert traffic.devices[rnd].down < 0.1 * n  # acknowledgements
        assert traffic.coordinator[rnd].down + traffic.coordinator[rnd].up < 10_000  # address lookups only
    as_dict = traffic.as_dict()
    assert as_dict["devices"]["up"] == [b.up for b in traffic.devices]
    assert set(as_dict) == {"devices", "coordinator", "broker"}


def test_the_traffic_meter_counts_the_new_test_s_rounds_and_not_an_earlier_test_s(tmp_path) -> None:
    with Lab() as lab:
        # Prepare: an earlier test's results.json with 5 rounds in the same folder
        broker, _server, d1 = lab.add_host("broker"), lab.add_host("server"), lab.add_host("d001")
        lab.start(broker, [sys.executable, "-c", SINK.format(ip=broker.ip)])
        lab.wait_for_port(d1, broker.ip, 9000)
        results = tmp_path / "results.json"
        _rounds(results, 5)
        meter = TrafficMeter(lab, results, ["d001"], interval=0.05)  # its own thread polls

        # Execute: the new coordinator replaces the file with 1, then 2 rounds
        for rnd in (1, 2):
            sent = lab.run(d1, [sys.executable, "-c", SEND.format(ip=broker.ip, n=500_000)])
            assert sent.returncode == 0, sent.stderr
            _rounds(results, rnd)
            deadline = time.monotonic() + 30
            while meter.rounds_measured < rnd and time.monotonic() < deadline:
                time.sleep(0.05)
        traffic = meter.stop()

    # Assert: two rounds of half a megabyte each, none lost to the old file
    assert meter.rounds_measured == 2 and traffic.error == "", traffic
    assert [500_000 <= b.up < 550_000 for b in traffic.devices] == [True, True], traffic


@pytest.mark.slow
def test_the_traffic_meter_counts_what_a_shaped_link_still_queues_as_received(tmp_path) -> None:
    # On 2026-11-27 a field test's round counted 1.7 MB more at the devices than the
    # broker sent: the reading came while a model sat in a shaped link's tbf queue,
    # counted where it entered the LAN in one round and where it left it in the next.
    with Lab() as lab:
        # Prepare: a device on an 8 Mbit/s link (its queue holds ~460 kB) swallows what
        # the broker host sends it
        broker, _server, d1 = lab.add_host("broker"), lab.add_host("server"), lab.add_host("d001")
        lab.shape(d1, 8)
        lab.start(d1, [sys.executable, "-c", SINK.format(ip=d1.ip)])
        lab.wait_for_port(broker, d1.ip, 9000)
        results = tmp_path / "results.json"
        meter = TrafficMeter(lab, results, ["d001"], interval=3600)  # polled by hand below

        # Execute: 1 MB to the device; the round is read as the sender exits, much of the
        # megabyte still queued on the device's link
        sent = lab.run(broker, [sys.executable, "-c", SEND.format(ip=d1.ip, n=1_000_000)])
        assert sent.returncode == 0, sent.stderr
        _rounds(results, 1)
        meter.poll()
        traffic = meter.stop()

    # Assert: what the broker's host sent in the round is what the device received or has
    # queued toward it; without the queue the two differed by ~460 kB. The queue and the
    # link counters are two commands' readings while TCP still drains the sender's buffer
    # in bursts: under the whole suite (2026-11-27) they were 54 kB apart, 1 % quiet, so
    # the bound is a fifth of what the queue holds
    assert len(traffic.devices) == 1, traffic
    assert traffic.devices[0].down > 100_000, traffic
    assert abs(traffic.broker[0].up - traffic.devices[0].down) < 92_000, traffic
