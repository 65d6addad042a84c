"""Injected faults in simulation: devices that never answer are retried around, and a
poisoner returns its boosted update, in chains and in parallel."""

from __future__ import annotations

import numpy as np
import pytest

from server.simulation.datasets import synthetic
from server.simulation.engine import Simulation
from server.simulation.faults import Faults
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.05)


@pytest.fixture(scope="module")
def model(zoo_model):
    return zoo_model("mclr_synthetic")


def test_rounds_whose_sampled_devices_are_all_silent_are_retried_and_the_run_finishes(model) -> None:
    # Prepare: 9 of 12 devices never answer; 3 are sampled per round
    fed = synthetic(1, 1, 12, seed=0)
    silent = frozenset(sorted(fed)[:9])
    sim = Simulation(
        make_strategy("fedavg", train=TRAIN, clients_per_round=3),
        fed,
        model,
        seed=0,
        faults=Faults(unresponsive=silent),
        max_attempts=4,
    )

    # Execute
    records = sim.run(6)

    # Assert: some rounds needed a retry, the run finished, and only live devices trained
    assert [r.round for r in records] == list(range(1, 7))
    assert any(r.extra.get("retries", 0) >= 1 for r in records)
    assert sum(r.trained for r in records) > 0
    assert all(r.skipped <= 3 for r in records)
    assert records[-1].federated_accuracy > records[0].federated_accuracy or records[-1].federated_accuracy > 0.3


@pytest.mark.parametrize("mode", ["parallel", "chain"])
def test_a_poisoner_returns_its_update_boosted(model, mode: str) -> None:
    from server.simulation.trainer import Trainer

    # Prepare
    fed = synthetic(1, 1, 3, seed=1)
    ids = sorted(fed)
    honest = Trainer(model, fed)
    poisoned = Trainer(model, fed, faults=Faults(scale={ids[0]: 100.0}))
    start = honest.model.get_weights()
    settings = TRAIN.to_wire()

    # Execute
    if mode == "parallel":
        a = honest.parallel(start, ids[0], settings, 0, 1).weights
        b = poisoned.parallel(start, ids[0], settings, 0, 1).weights
        assert a is not None and b is not None
        expected = start + 100.0 * (a.astype(np.float64) - start)
    else:
        a = honest.chain(start, ids[:1], settings, 0, 1).final_weights
        b = poisoned.chain(start, ids, settings, 0, 1).final_weights
        expected = None

    # Assert
    if expected is not None:
        np.testing.assert_allclose(b, expected, rtol=1e-4, atol=1e-5)
    else:  # the chain went on from the poisoned model: far from any honest chain
        assert np.linalg.norm(b - start) > 20 * np.linalg.norm(a - start)
