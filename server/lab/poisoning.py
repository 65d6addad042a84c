"""One poisoner among FEMNIST writers, on boards and in simulation, screened or not.

The same writers serve as virtual devices and as ``covey-device`` processes, named
alike (``dev000``, ...), so that the seed rule gives them the same batches and the one
round driver the same models (``tests/mqtt/test_equivalence.py``). ``dev000`` is the
poisoner: on boards a script that boosts every trained update
(``tests/mqtt/poisoning_agent.py``), in simulation :class:`~server.simulation.faults.Faults`.
``tests/mqtt/test_poisoning.py`` asserts on these runs and ``bench/poisoning.py --mqtt``
prints their figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from device.data import Dataset, read_leaf
from server.backend import RoundRecord
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.reference import server_norm
from server.screening import ScreeningConfig
from server.simulation.datasets import ClientData
from server.simulation.engine import Simulation
from server.simulation.faults import Faults
from server.simulation.trainer import server_evaluator
from server.strategies.base import Strategy

POISONER = "dev000"


@dataclass
class Outcome:
    records: list[RoundRecord]
    weights: np.ndarray

    @property
    def final_accuracy(self) -> float:
        return self.records[-1].server_accuracy

    @property
    def rejected(self) -> dict[str, int]:
        """Updates and messages refused per device, over the run."""
        out: dict[str, int] = {}
        for r in self.records:
            for device, n in r.rejected.items():
                out[device] = out.get(device, 0) + n
        return out


def device_ids(n: int) -> list[str]:
    return [f"dev{i:03d}" for i in range(n)]


def simulate(
    make: Callable[[], Strategy],
    *,
    root: Path,
    model_path: Path,
    eval_data: Dataset,
    rounds: int,
    n_devices: int,
    seed: int,
    screening: ScreeningConfig | None,
    scale: float | None,
) -> Outcome:
    """The run on virtual devices; ``scale``: dev000 poisons (``None``: everyone honest)."""
    train, test = _leaf_splits(root)
    if n_devices > len(train):
        raise ValueError(f"{root} has {len(train)} writers, {n_devices} requested")
    fed = {d: ClientData(train[w], test[w]) for d, w in zip(device_ids(n_devices), train, strict=False)}
    strategy = make()
    sim = Simulation(
        strategy,
        fed,
        model_path,
        seed=seed,
        federated_eval_every=0,
        faults=Faults(scale={POISONER: scale}) if scale is not None else None,
        screening=screening,
        server_eval=server_evaluator(model_path, eval_data),
        reference=server_norm(model_path, eval_data),  # as the coordinator with --eval-data
    )
    records = sim.run(rounds)
    assert strategy.global_weights is not None
    return Outcome(records, strategy.global_weights.copy())


@lru_cache(maxsize=2)
def _leaf_splits(root: Path) -> tuple[dict[str, Dataset], dict[str, Dataset]]:
    """A LEAF folder's train and test splits, read once per process for the many runs
    a comparison makes (reading FEMNIST's JSON is 40 % of a 20-round run). The arrays
    are read-only, so no run can change another's data."""
    splits = read_leaf(root / "train"), read_leaf(root / "test")
    for split in splits:
        for data in split.values():
            data.x.flags.writeable = False
            data.y.flags.writeable = False
    return splits


def on_boards(
    make: Callable[[], Strategy],
    *,
    root: Path,
    model_path: Path,
    eval_data: Dataset,
    rounds: int,
    n_devices: int,
    seed: int,
    screening: ScreeningConfig | None,
    poisoner_script: Path | None,
    scale: float,
    host: str,
    port: int,
    work: Path,
    run: str,
    deadline_s: float = 120.0,
) -> Outcome:
    """The run over MQTT with agent processes; dev000 runs ``poisoner_script`` (boosting
    its updates by ``scale``) unless it is ``None``."""
    ids = device_ids(n_devices)
    scripts = {POISONER: poisoner_script} if poisoner_script is not None else None
    strategy = make()
    with start_fleet(
        root,
        leaf_writers(root, n_devices),
        run=run,
        host=host,
        port=port,
        log_dir=work / "logs",
        device_ids=ids,
        scripts=scripts,
        extra_env={"COVEY_POISON_SCALE": str(scale)},
    ):
        coord = Coordinator(
            CoordinatorConfig(run, host, port, work / "state", deadline_s=deadline_s, seed=seed, screening=screening),
            strategy,
            model_path,
            eval_data,
        )
        records = coord.run_rounds(n_devices, rounds, register_timeout=180)
    assert strategy.global_weights is not None
    return Outcome(records, strategy.global_weights.copy())
