"""Issue 28's scale run: one coordinator, 4 edges and 1,000 devices on this machine.

:func:`scale_run` starts a central mosquitto and, per edge, a room mosquitto bridged to
it (:func:`server.field.edges.edge_config_text`) with ``covey edge run --broker`` beside
it; the devices are real agents (:mod:`server.lab.swarm`, a few processes of them on a
Synthetic(1, 1) federation and the ``mclr_synthetic`` model), each room's on its room's
broker. The coordinator runs in this process (``Coordinator.run_rounds``'s steps, without
``covey server run``'s link measurement, which at 1,000 devices would take most of an
hour), HierFAVG with one group per edge. ``through_edges=False`` runs the same devices
on the central broker alone, every group at the coordinator: the reference the edges'
figures are read against.

What it measures: the coordinator's CPU seconds per round (this process's, while the
rounds run) and its peak RSS; each edge host's CPU per round and RSS, and the brokers'
CPU per round (``/proc``).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from device.data import Dataset
from server.broker import free_port, run_mosquitto, start_mosquitto
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.field.edges import edge_config_text
from server.field.fieldtest import wait_for_text
from server.lab.swarm import swarm_ids
from server.paths import ensure_model
from server.simulation.datasets import synthetic
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

REPO = Path(__file__).resolve().parents[2]
RUN = "scale"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ScaleFigures:
    """What one scale run measured."""

    devices: int
    rounds: int
    wall_s_per_round: float
    coordinator_cpu_s_per_round: float
    coordinator_rss_mb: float
    trained_per_round: list[int] = field(default_factory=list)
    edge_cpu_s_per_round: list[float] = field(default_factory=list)
    edge_rss_mb: list[float] = field(default_factory=list)
    broker_cpu_s_per_round: dict[str, float] = field(default_factory=dict)
    groups_at_edges: int = 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def peak_rss_mb(pid: int) -> float:
    """The peak resident set of process ``pid`` (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _python(*argv: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def scale_run(
    work: Path,
    *,
    devices: int = 1000,
    edges: int = 4,
    rounds: int = 5,
    per_process: int = 125,
    through_edges: bool = True,
) -> ScaleFigures:
    """``rounds`` of HierFAVG on ``devices`` agents behind ``edges`` edges (or, without
    ``through_edges``, all on the central broker); see the module docstring."""
    work.mkdir(parents=True, exist_ok=True)
    model = ensure_model("mclr_synthetic")
    ids = swarm_ids(0, devices)
    rooms = {f"e{k + 1}": tuple(chunk) for k, chunk in enumerate(np.array_split(np.array(ids), edges))}
    procs: list[subprocess.Popen[bytes]] = []
    central = start_mosquitto()
    brokers = {"central": central}
    hosts: list[subprocess.Popen[bytes]] = []
    try:
        first = 0
        for name, members in rooms.items():
            address = central.address
            if through_edges:
                port = free_port()
                conf = work / f"{name}.conf"
                text = edge_config_text(RUN, name, members, listen="127.0.0.1", uplink=central.address, port=port)
                conf.write_text(text)
                brokers[name] = run_mosquitto(conf, "127.0.0.1", port, log=work / f"broker-{name}.log")
                address = f"127.0.0.1:{port}"
                log = work / f"edge-{name}.log"
                argv = ["-m", "covey.cli", "edge", "run", "--broker", address, "--run", RUN, "--edge", name]
                hosts.append(_python(*argv, "--devices", ",".join(members), log=log))
                wait_for_text(log, f"edge {name}: group managers for", 120, hosts[-1])
            for start in range(first, first + len(members), per_process):
                count = min(per_process, first + len(members) - start)
                argv = ["-m", "server.lab.swarm", "--broker", address, "--run", RUN, "--first", str(start)]
                argv += ["--count", str(count), "--total", str(devices), "--state-dir", str(work / "agents")]
                procs.append(_python(*argv, log=work / f"swarm-{start:04d}.log"))
            first += len(members)
        data = synthetic(1.0, 1.0, devices, seed=0)
        tests = [c.test for c in data.values() if c.test is not None and len(c.test)]
        eval_data = Dataset(np.concatenate([t.x for t in tests]), np.concatenate([t.y for t in tests]))
        config = CoordinatorConfig(
            RUN,
            central.host,
            central.port,
            work / "state",
            deadline_s=600.0,
            max_devices=devices,
            max_registrations_per_s=100.0,
            allowed_devices=frozenset(ids),  # as a site's provisioned ids: all 1,000 may queue for their ping
            edges=dict(rooms) if through_edges else {},
        )
        strategy = make_strategy("hierfavg", train=TrainConfig(1, 10, 0.05, max_steps=5), tau2=2)
        coordinator = Coordinator(config, strategy, model, eval_data)
        watched = {n: b.process for n, b in brokers.items()}
        at_start: dict[str, float] = {}
        clock: list[float] = []

        def on_ready() -> None:
            clock[:] = [time.perf_counter(), time.process_time()]
            for name, proc in watched.items():
                if proc is not None:
                    at_start[name] = cpu_seconds(proc.pid)
            for k, host in enumerate(hosts):
                at_start[f"host{k}"] = cpu_seconds(host.pid)

        records = coordinator.run_rounds(devices, rounds, register_timeout=900.0, on_ready=on_ready)
        wall, cpu = time.perf_counter() - clock[0], time.process_time() - clock[1]
        figures = ScaleFigures(
            devices,
            rounds,
            wall / rounds,
            cpu / rounds,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            trained_per_round=[r.trained for r in records],
        )
        for name, proc in watched.items():
            if proc is not None:
                figures.broker_cpu_s_per_round[name] = (cpu_seconds(proc.pid) - at_start[name]) / rounds
        for k, host in enumerate(hosts):
            figures.edge_cpu_s_per_round.append((cpu_seconds(host.pid) - at_start[f"host{k}"]) / rounds)
            figures.edge_rss_mb.append(peak_rss_mb(host.pid))
    finally:
        for proc in [*procs, *hosts]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*procs, *hosts]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for broker in brokers.values():
            broker.stop()
    said = " ".join(p.read_text(errors="replace") for p in work.glob("edge-*.log"))
    figures.groups_at_edges = sum(int(n) for n in re.findall(r"stopped: (\d+) groups run here", said))
    return figures
