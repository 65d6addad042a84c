"""``bench/insider.py --boards``: the transport attacks on a real site.

A site made by :func:`server.site.init_site` (what `covey site init` runs: TLS, a
password per board, the generated ACL and broker limits), its mosquitto started from
the generated config, the boards as agent processes with their site bundles, and
dev000 as ``bench/insider_agent.py`` (a real agent that attacks with its own identity).
The coordinator connects on the site's loopback listener with its own password.

Each strategy (FedAvg over every board; FedGSP with two relayed chains) runs clean
and under every transport attack at once (flood, 16 MiB frames, partial hoard,
retained junk); FedAvg also with a NaN member alone (the round time it costs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from covey.paths import ensure_model, femnist_dir
from device.data import Dataset, read_leaf
from server.backend import RoundRecord
from server.broker import free_port, run_mosquitto
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.site import SiteSpec, init_site
from server.strategies import make_strategy
from server.strategies.base import Strategy, TrainConfig

REPO = Path(__file__).resolve().parent.parent
INSIDER = "dev000"
TRANSPORT = "flood,bigframes,hoard,retained"


class PeakRss:
    """Samples the RSS of a set of processes every 0.2 s; ``peak[name]`` in MB."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.peak = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for name, proc in self.procs.items():
                with contextlib.suppress(psutil.Error):  # an agent that left
                    self.peak[name] = max(self.peak[name], proc.memory_info().rss / 2**20)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peak


@dataclass
class Run:
    records: list[RoundRecord]
    peak_mb: dict[str, float]

    def victims_skipped(self) -> int:
        """Honest members planned but not credited, over the run."""
        return sum(sum(1 for g in r.groups for d in g if d != INSIDER and d not in r.trained_ids) for r in self.records)

    def round_s(self) -> float:
        return float(np.mean([r.wall_s for r in self.records]))


def run_site(
    make: Callable[[], Strategy], attacks: str, args: argparse.Namespace, work: Path, held_out: Dataset
) -> Run:
    devices = [f"dev{i:03d}" for i in range(args.devices)]
    spec = SiteSpec(
        run="insider",
        hosts=("localhost",),
        ips=("127.0.0.1",),
        devices=tuple(devices),
        port=free_port(),
        loopback_port=free_port(),
    )
    site = init_site(work / "site", spec)
    broker = run_mosquitto(site.layout.broker_conf, "127.0.0.1", spec.port, log=work / "mosquitto.log")
    configs = []
    for d in devices:
        toml = site.layout.bundle(d) / "device.toml"
        toml.write_text(toml.read_text().replace('broker = "localhost:', 'broker = "127.0.0.1:'))
        configs.append(toml)
    root = femnist_dir()
    env = {"COVEY_INSIDER_ATTACKS": attacks, "COVEY_INSIDER_PEERS": ",".join(devices[1:])}
    try:
        with start_fleet(
            root,
            leaf_writers(root, len(devices)),
            run=spec.run,
            host="",
            port=0,
            configs=configs,
            device_ids=devices,
            log_dir=work / "logs",
            scripts={INSIDER: REPO / "bench" / "insider_agent.py"},
            extra_env=env,
        ) as fleet:
            password = (site.layout.coordinator_dir / "password").read_text().strip()
            coord = Coordinator(
                CoordinatorConfig(
                    spec.run,
                    "127.0.0.1",
                    spec.loopback_port or 0,
                    work / "state",
                    deadline_s=args.deadline,
                    seed=args.seed,
                    username="coordinator",
                    password=password,
                ),
                make(),
                ensure_model("mlp_femnist"),
                held_out,
            )
            pids = {f"agent {d}": p.pid for d, p in zip(devices, fleet.processes, strict=True) if d != INSIDER}
            assert broker.process is not None
            meters: list[PeakRss] = []

            def measure() -> None:  # from round 1: registration is not what the table reports
                meters.append(PeakRss({**pids, "broker": broker.process.pid}))  # type: ignore[union-attr]

            try:
                records = coord.run_rounds(len(devices), args.board_rounds, register_timeout=180, on_ready=measure)
            finally:
                peak = meters[0].stop() if meters else {}
    finally:
        broker.stop()
    return Run(records, peak)


def boards_part(args: argparse.Namespace) -> None:
    test = read_leaf(femnist_dir() / "test")
    held_out = Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))
    train = TrainConfig(1, 10, 0.003)
    strategies: dict[str, Callable[[], Strategy]] = {
        "fedavg": lambda: make_strategy("fedavg", train=train, clients_per_round=args.devices),
        "fedgsp_2chain": lambda: make_strategy("fedgsp", train=train, growth="linear", alpha=0.0, beta=2, kappa=1.0),
    }
    skipped = 0
    agent_peak = broker_peak = 0.0
    clean_fedavg = nan_fedavg = float("nan")
    for name, make in strategies.items():
        conditions = {"clean": "", "transport": TRANSPORT}
        if name == "fedavg":
            conditions["nan"] = "nan"
        for condition, attacks in conditions.items():
            with tempfile.TemporaryDirectory(prefix="covey-insider-") as tmp:
                os.chmod(tmp, 0o755)  # run as root, mosquitto (its own user) must enter the site
                run = run_site(make, attacks, args, Path(tmp), held_out)
            agents = max(v for k, v in run.peak_mb.items() if k.startswith("agent"))
            acc = 100 * run.records[-1].server_accuracy
            print(
                f"{name} {condition:9s}: accuracy {acc:.1f} %, round {run.round_s():.2f} s, victims skipped "
                f"{run.victims_skipped()}, peak agent {agents:.0f} MB, broker {run.peak_mb['broker']:.0f} MB",
                flush=True,
            )
            if condition != "clean":
                skipped += run.victims_skipped()
                agent_peak, broker_peak = max(agent_peak, agents), max(broker_peak, run.peak_mb["broker"])
            if name == "fedavg" and condition == "clean":
                clean_fedavg = run.round_s()
            if name == "fedavg" and condition == "nan":
                nan_fedavg = run.round_s()
    print(f"figure insider_victim_rounds_skipped = {skipped}")
    print(f"figure insider_agent_peak_rss_mb = {agent_peak:.0f}")
    print(f"figure insider_broker_peak_rss_mb = {broker_peak:.0f}")
    print(f"figure nan_member_round_s_ratio = {nan_fedavg / clean_fedavg:.2f}")
