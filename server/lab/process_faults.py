"""Faults on one machine: kill a device, the broker or the coordinator, cut a device's
connection, duplicate and reorder deliveries — and what each costs a run.

:func:`run_with_fault` runs FedGSP (chains with direct hand-offs, the most fragile
path) as a user does — ``covey server run`` as its own process, agents as their own
processes, mosquitto with persistence — and injects one :data:`Fault` mid-round. It
reports whether the run finished, its accuracy, its final model (from the last
checkpoint) and the contributions lost: results a device logged as trained whose
round's model does not hold them. ``tests/mqtt/test_faults.py`` asserts on it and
``bench/faults.py`` prints the figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from device.mqtt import MqttLink
from server.broker import LOCAL_CONF, free_port, mosquitto_binary, wait_for_port
from server.coordinator import checkpoint
from server.fleet import Fleet, leaf_writers, start_fleet
from server.records import json_number

REPO = Path(__file__).resolve().parent.parent
Fault = Literal["none", "device_kill", "broker_restart", "coordinator_kill", "flaky_connection", "duplicates"]
FAULTS: tuple[Fault, ...] = ("device_kill", "broker_restart", "coordinator_kill", "flaky_connection", "duplicates")


class PersistentBroker:
    """mosquitto on a fixed port with persistence in a folder that outlives restarts."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        text = LOCAL_CONF.read_text().replace("{port}", str(self.port))
        text = text.replace(
            "persistence false", f"persistence true\npersistence_location {self.dir}/\nautosave_interval 1"
        )
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text(text)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.dir / "mosquitto.log").open("ab")
        self.process = subprocess.Popen([mosquitto_binary(), "-c", str(self.conf)], stdout=log, stderr=log)
        wait_for_port("127.0.0.1", self.port, 10)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


class FlakyRelay:
    """A TCP relay in front of the broker that cuts every connection through it at
    random: each half second, with probability ``p`` (a device on flaky Wi-Fi)."""

    def __init__(self, target_port: int, p: float, seed: int = 0) -> None:
        self.target, self.p, self.rng = target_port, p, random.Random(seed)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cuts = 0
        self._stop = threading.Event()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._cutter, daemon=True).start()

    def _accept(self) -> None:
        self.server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _cutter(self) -> None:
        while not self._stop.wait(0.5):
            if self.rng.random() < self.p:
                with self._lock:
                    pairs, self._pairs = self._pairs, []
                for pair in pairs:
                    self.cuts += 1
                    for s in pair:
                        with contextlib.suppress(OSError):
                            s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self.server.close()


class Replayer:
    """Publishes every message a device sends once more, 0-2 s later: duplicates that
    arrive out of order (the broker here has no ACL, so it may)."""

    def __init__(self, port: int, run: str, seed: int = 0) -> None:
        self.link = MqttLink(f"replayer-{run}", "127.0.0.1", port, clean_session=True)
        self.link.connect(10)
        self.link.subscribe(
            f"covey/{run}/from/+/results", f"covey/{run}/from/+/frames", f"covey/{run}/device/+/frames/from/+"
        )
        self.rng = random.Random(seed)
        self.replayed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending: list[tuple[float, str, bytes]] = []
        while not self._stop.is_set():
            item = self.link.receive(0.05)
            if item is not None and not item.retain:
                pending.append((time.monotonic() + self.rng.uniform(0, 2), item.topic, item.payload))
            due = [p for p in pending if p[0] <= time.monotonic()]
            pending = [p for p in pending if p[0] > time.monotonic()]
            for _, topic, payload in sorted(due, key=lambda _: self.rng.random()):
                self.link.publish(topic, payload)
                self.replayed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.link.close()


@dataclass
class FaultRun:
    fault: Fault
    finished: bool
    rounds: list[dict[str, object]] = field(default_factory=list)
    weights: np.ndarray | None = field(default=None, repr=False)
    lost: int = 0
    detail: str = ""

    @property
    def accuracy(self) -> float:
        return json_number(self.rounds[-1]["server_accuracy"]) if self.rounds else float("nan")


TRAINED = re.compile(r"(dev\d+): round (\d+) group \d+ position \d+ trained")


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.1)


def _trained(logs: Path) -> set[tuple[str, int]]:
    found = set()
    for path in logs.glob("*.log"):
        for m in TRAINED.finditer(path.read_text(errors="replace")):
            found.add((m.group(1), int(m.group(2))))
    return found


def run_with_fault(
    fault: Fault,
    *,
    root: Path,
    model_path: Path,
    work: Path,
    rounds: int = 4,
    n_devices: int = 5,
    seed: int = 0,
    deadline_s: float = 20.0,
    fault_round: int = 2,
) -> FaultRun:
    """One FedGSP run over ``n_devices`` FEMNIST writers with ``fault`` in round ``fault_round``."""
    run, state, logs = f"faults-{fault.replace('_', '')}", work / "state", work / "logs"
    broker = PersistentBroker(work / "broker")
    broker.start()
    relay = FlakyRelay(broker.port, 0.05, seed) if fault == "flaky_connection" else None
    replayer: Replayer | None = None
    writers = leaf_writers(root, n_devices)
    ids = [f"dev{i:03d}" for i in range(n_devices)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [
        sys.executable,
        "-m",
        "covey.cli",
        "server",
        "run",
        "--broker",
        f"127.0.0.1:{broker.port}",
        "--run",
        run,
        "--strategy",
        "fedgsp",
        "--set",
        "growth=linear",
        "--set",
        "alpha=1",
        "--set",
        "beta=2",
        "--set",
        "kappa=1.0",
        "--min-devices",
        str(n_devices),
        "--rounds",
        str(rounds),
        "--model-path",
        str(model_path),
        "--eval-data",
        str(root),
        "--state-dir",
        str(state),
        "--deadline",
        str(deadline_s),
        "--seed",
        str(seed),
        "--federated-eval-every",
        "0",
        "--handoff",
        "direct",
        "--register-timeout",
        "120",
    ]
    server_log = (work / "server.log").open("ab")

    def coordinator(*extra: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*cmd, *extra], cwd=REPO, env=env, stdout=server_log, stderr=subprocess.STDOUT)

    fleets: list[Fleet] = []
    proc = None
    try:
        fleets.append(
            start_fleet(
                root,
                writers[:-1] if relay else writers,
                run=run,
                host="127.0.0.1",
                port=broker.port,
                log_dir=logs,
                device_ids=ids[:-1] if relay else ids,
            )
        )
        if relay is not None:
            fleets.append(
                start_fleet(
                    root, writers[-1:], run=run, host="127.0.0.1", port=relay.port, log_dir=logs, device_ids=ids[-1:]
                )
            )
        if fault == "duplicates":
            replayer = Replayer(broker.port, run, seed)
        proc = coordinator()
        journal = state / "journal.json"

        def mid_round() -> bool:  # the fault round is planned and someone has trained in it
            return journal.exists() and any(r == fault_round for _, r in _trained(logs))

        if fault in ("device_kill", "broker_restart", "coordinator_kill"):
            _wait(mid_round, 300, f"round {fault_round} under way")
            if fault == "device_kill":
                fleets[0].processes[n_devices // 2].send_signal(signal.SIGKILL)
                time.sleep(1.0)  # the board stays down a moment, then reboots
                fleets[0].restart(n_devices // 2)
            elif fault == "broker_restart":
                broker.kill()
                time.sleep(2.0)
                broker.start()
            else:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                proc = coordinator("--resume")
        code = proc.wait(900)
        rounds_done = (
            json.loads((state / "results.json").read_text())["rounds"] if (state / "results.json").exists() else []
        )
        final = checkpoint.load(state)
        weights = final["strategy"].global_weights if final is not None else None
        accepted = {(d, int(r["round"])) for r in rounds_done for d in r.get("trained_ids", [])}
        lost = len(_trained(logs) - accepted)
        return FaultRun(
            fault,
            code == 0 and len(rounds_done) == rounds,
            rounds_done,
            weights,
            lost,
            f"exit {code}, {len(rounds_done)} rounds",
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        for fleet in fleets:
            fleet.stop()
        if replayer is not None:
            replayer.close()
        if relay is not None:
            relay.close()
        broker.stop()
        server_log.close()


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="covey-faults-"))
