"""Run one strategy twice, in simulation and over MQTT with agent processes, and compare.

The one round driver promises that the same seed and plan give the same models on
virtual devices and on boards. :func:`run_both` checks that promise end to end: the
same FEMNIST writers as virtual devices and as ``covey-device`` processes (named
alike, so the seed rule gives them the same batches), the same strategy settings and
seed, federated evaluation every round. ``tests/mqtt/test_equivalence.py`` asserts on
it and ``bench/equivalence.py`` prints the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from device.data import read_leaf
from device.protocol import WireCodec
from server.backend import RoundRecord
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.loopback import LoopbackBroker, LoopbackFleet
from server.simulation.datasets import ClientData
from server.simulation.engine import Simulation
from server.simulation.faults import Faults
from server.strategies.base import Strategy


@dataclass
class Comparison:
    sim: list[RoundRecord]
    mqtt: list[RoundRecord]
    max_abs_diff: float  # over every model the strategy keeps (global and group models)
    accuracy_diff: float  # largest per-round difference of federated accuracy

    @property
    def rounds(self) -> int:
        return len(self.sim)


def _models(strategy: Strategy) -> list[np.ndarray]:
    assert strategy.global_weights is not None
    return [strategy.global_weights, *getattr(strategy, "group_models", [])]


def run_both(
    make: Callable[[], Strategy],
    *,
    root: Path,
    model_path: Path,
    host: str,
    port: int,
    work: Path,
    run: str,
    rounds: int,
    n_devices: int = 6,
    handoff: str = "direct",
    seed: int = 3,
    deadline_s: float = 120.0,
    codec: WireCodec = "fp32",
    silent: Mapping[str, Path] | None = None,
    boards: Literal["mqtt", "loopback"] = "mqtt",
) -> Comparison:
    """The strategy from ``make()`` over ``n_devices`` FEMNIST writers, both ways, with
    models on the wire in ``codec``. ``silent``: devices that never answer, each id with
    the script its board runs instead of the agent (one that registers, then ignores its
    requests); the simulator runs them as ``Faults(unresponsive=...)``. Give a
    ``deadline_s`` that the others meet with room to spare: whoever misses it is
    skipped, on boards only. ``boards="loopback"`` runs the same coordinator and agent code
    in this process over :class:`~server.loopback.LoopbackBroker` instead of agent
    processes over mosquitto (``host``/``port`` unused; ``silent`` not supported)."""
    writers = leaf_writers(root, n_devices)
    ids = [f"dev{i:03d}" for i in range(n_devices)]
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    federation = {d: ClientData(train[w], test[w]) for d, w in zip(ids, writers, strict=True)}

    sim_strategy = make()
    sim = Simulation(
        sim_strategy,
        federation,
        model_path,
        seed=seed,
        federated_eval_every=1,
        codec=codec,
        handoff=handoff,  # type: ignore[arg-type]
        faults=Faults(unresponsive=frozenset(silent or {})),
    )
    sim_records = sim.run(rounds)

    mqtt_strategy = make()
    config = CoordinatorConfig(
        run,
        host,
        port,
        work / "state",
        handoff=handoff,
        deadline_s=deadline_s,
        seed=seed,
        federated_eval_every=1,
        codec=codec,
    )
    if boards == "loopback":
        if silent:
            raise ValueError("silent devices run as scripts of their own: boards='mqtt' only")
        mqtt_records = run_loopback(config, mqtt_strategy, model_path, federation, rounds, work)
    else:
        with start_fleet(
            root,
            writers,
            run=run,
            host=host,
            port=port,
            log_dir=work / "logs",
            device_ids=ids,
            scripts=dict(silent or {}),
        ):
            mqtt_records = Coordinator(config, mqtt_strategy, model_path).run_rounds(n_devices, rounds)

    pairs = list(zip(_models(sim_strategy), _models(mqtt_strategy), strict=True))
    diff = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in pairs)
    acc = max(abs(a.federated_accuracy - b.federated_accuracy) for a, b in zip(sim_records, mqtt_records, strict=True))
    return Comparison(sim_records, mqtt_records, diff, acc)


def run_loopback(
    config: CoordinatorConfig,
    strategy: Strategy,
    model_path: Path,
    federation: Mapping[str, ClientData],
    rounds: int,
    work: Path,
) -> list[RoundRecord]:
    """``rounds`` rounds of the coordinator with one agent per device of ``federation``,
    all in this process over a :class:`~server.loopback.LoopbackBroker`."""
    broker = LoopbackBroker()
    devices = {d: (data.train, data.test) for d, data in federation.items()}
    with LoopbackFleet(broker, devices, run=config.run, state_dir=work / "agents"):
        return Coordinator(config, strategy, model_path, link_factory=broker.link).run_rounds(len(devices), rounds)
