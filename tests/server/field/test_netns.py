"""The virtual LAN: hosts in their own network namespaces talk over a bridge, links are
shaped with tbf, and everything the lab made is gone afterwards, even after a failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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
