"""Faults at a field test's edges (issue 28, Build 3), in the lab's network namespaces.

A :data:`FieldFault` runs in a thread beside a field test's coordinator once every
process is up (:func:`server.field.fieldtest.run_field_test`'s ``fault``) and acts on
the :class:`FieldScene`:

* :func:`cut_uplink`: the gateway's uplink interface down for a while, then up again:
  the cable pulled. The room's broker keeps its bridge's queue, its groups finish, and
  what they send up waits until the link is back;
* :func:`restart_edge`: ``covey edge run`` on a gateway killed (SIGKILL: no clean stop)
  and started again with the same arguments: it takes up what its checkpoint held.

:func:`lost_contributions` counts what a fault cost: boards that logged a round's
training whose result that round's models do not hold.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from server.field.netns import Host, Lab

TRAINED = re.compile(r"(\S+): round (\d+) group \d+ position \d+ trained")


@dataclass
class EdgeProcess:
    """One gateway's ``covey edge run``: how it was started, and the process now."""

    argv: list[str]
    log: Path
    env: dict[str, str]
    cwd: Path
    proc: subprocess.Popen[bytes]
    restarts: int = 0


@dataclass
class FieldScene:
    """What a fault may act on while a field test runs: the lab, its log folder, each
    edge site's gateway and ``covey edge run`` (by the edge's name), and each edge
    site's boards."""

    lab: Lab
    log_dir: Path
    gateways: dict[str, Host] = field(default_factory=dict)
    edges: dict[str, EdgeProcess] = field(default_factory=dict)
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)  # set when the coordinator ended


FieldFault = Callable[[FieldScene], None]


def cut_uplink(scene: FieldScene, edge: str, seconds: float) -> None:
    """Take ``edge``'s gateway's uplink (``eth0``, on the main network) down for
    ``seconds`` (less if the run ends first), then up again."""
    gateway = scene.gateways[edge]
    scene.lab.run(gateway, ["ip", "link", "set", "eth0", "down"], timeout=30).check_returncode()
    try:
        scene.done.wait(seconds)
    finally:
        scene.lab.run(gateway, ["ip", "link", "set", "eth0", "up"], timeout=30).check_returncode()


def restart_edge(scene: FieldScene, edge: str) -> None:
    """Kill ``edge``'s ``covey edge run`` (SIGKILL) and start it again, with the same
    arguments; its output goes on in the same log."""
    process = scene.edges[edge]
    process.proc.kill()
    process.proc.wait(15)
    with process.log.open("ab") as out:
        out.write(b"\n--- killed (SIGKILL) and started again by the fault ---\n")
    process.proc = scene.lab.start(
        scene.gateways[edge], process.argv, log=process.log, env=process.env, cwd=process.cwd
    )
    process.restarts += 1


def wait_for_round_at_edge(scene: FieldScene, edge: str, rnd: int, *, training: bool, timeout: float = 1800) -> bool:
    """Until round ``rnd``'s group runs at ``edge`` and, with ``training``, each of its
    members holds its start model (they train now); False if the run ended or
    ``timeout`` passed first."""
    log = scene.edges[edge].log
    members = scene.members[edge]
    deadline = time.monotonic() + timeout
    at_edge = re.compile(rf"round {rnd} group (\d+): \d+ members, run here")
    while time.monotonic() < deadline and not scene.done.is_set():
        found = at_edge.search(log.read_text(errors="replace"))
        if found and not training:
            return True
        if found:
            task = re.compile(rf"(\S+): model for \S+-r{rnd}-g{found.group(1)}-p\d+ arrived")
            said = "".join(_read(scene.log_dir / f"{d}.log") for d in members)
            if set(task.findall(said)) >= set(members):
                return True
        time.sleep(0.02)
    return False


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def lost_contributions(log_dir: Path, results: Path) -> int:
    """Boards that logged a round's training (``log_dir/<device>.log``) whose result
    that round's models do not hold (``results.json``'s ``trained_ids``)."""
    rows = json.loads(results.read_text())["rounds"]
    said = "".join(_read(p) for p in log_dir.glob("*.log") if not p.name.startswith(("edge-", "broker", "relay-")))
    trained = {(d, int(r)) for d, r in TRAINED.findall(said)}
    held = {(d, int(r["round"])) for r in rows for d in r["trained_ids"]}
    return len(trained - held)
