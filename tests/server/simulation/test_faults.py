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


def test_a_poisoner_returns_its_update_boosted(model) -> None:
    from server.simulation.trainer import Trainer

    # Prepare
    fed = synthetic(1, 1, 3, seed=1)
    ids = sorted(fed)
    honest = Trainer(model, fed)
    poisoned = Trainer(model, fed, faults=Faults(scale={ids[0]: 100.0}))
    start = honest.model.get_weights()
    settings = TRAIN.to_wire()

    # Execute
    a = honest.train(start, ids[0], settings, 0, 1).outcome
    b = poisoned.train(start, ids[0], settings, 0, 1).outcome

    # Assert
    assert a is not None and b is not None
    np.testing.assert_allclose(b.weights, start + 100.0 * (a.weights.astype(np.float64) - start), rtol=1e-4, atol=1e-5)


def test_a_chain_goes_on_from_a_poisoner_s_boosted_hand_off(model) -> None:
    from server.simulation.engine import VirtualDevices
    from server.strategies.base import GroupPlan, RoundPlan

    # Prepare: the same chain with and without a poisoner first, hand-offs unscreened
    fed = synthetic(1, 1, 3, seed=1)
    ids = tuple(sorted(fed))
    honest = VirtualDevices(fed, model, handoff="direct")
    poisoned = VirtualDevices(fed, model, faults=Faults(scale={ids[0]: 100.0}), handoff="direct")
    start = honest.initial_weights()
    plan = RoundPlan(1, (GroupPlan(0, ids, "chain", "m"),), {"m": start}, TRAIN)

    # Execute
    try:
        (a,) = honest.execute(plan, seed=0)
        (b,) = poisoned.execute(plan, seed=0)
    finally:
        honest.close()
        poisoned.close()

    # Assert: the chain went on from the poisoned model, far from the honest chain
    assert a.final_weights is not None and b.final_weights is not None
    assert np.linalg.norm(b.final_weights - start) > 20 * np.linalg.norm(a.final_weights - start)
