"""A dishonest chain member in simulation: its boosted, NaN or x10^30 hand-off is refused
on the way (server/hops.py), the chain goes on from its input, the run never crashes
and the honest members' work is kept.

Attacks (issue 26, 2 and 7): FedGSP with one chain of seven, one member x100: the whole
chain was refused every round; a x10^30 member crashed the simulation (WeightsError)."""

from __future__ import annotations

import numpy as np
import pytest

from covey.paths import ensure_model, femnist_dir
from device.data import Dataset, read_leaf
from server.fleet import leaf_writers
from server.hops import HOP_REASON
from server.reference import server_norm
from server.rounds import DEFAULT_SCREENING
from server.simulation.datasets import ClientData
from server.simulation.engine import Simulation
from server.simulation.faults import Faults
from server.simulation.trainer import server_evaluator
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

INSIDER = "dev000"
ROUNDS = 3


@pytest.fixture(scope="module")
def femnist():  # type: ignore[no-untyped-def]
    root = femnist_dir()
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    held_out = Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))
    ids = [f"dev{i:03d}" for i in range(7)]
    fed = {d: ClientData(train[w], test[w]) for d, w in zip(ids, leaf_writers(root, 7), strict=True)}
    return fed, held_out


def _run(femnist, faults: Faults | None, chains: int = 1, screening=DEFAULT_SCREENING):  # type: ignore[no-untyped-def]
    fed, held_out = femnist
    model = ensure_model("mlp_femnist")
    strategy = make_strategy(
        "fedgsp", train=TrainConfig(1, 10, 0.003), growth="linear", alpha=0.0, beta=chains, kappa=1.0
    )
    sim = Simulation(
        strategy,
        fed,
        model,
        seed=1,
        federated_eval_every=0,
        faults=faults,
        screening=screening,
        server_eval=server_evaluator(model, held_out),
        reference=server_norm(model, held_out),
    )
    return sim.run(ROUNDS), strategy.global_weights


@pytest.mark.slow
@pytest.mark.parametrize("scale", [100.0, float("nan"), 1e30])
def test_a_bad_hand_off_costs_only_its_member(femnist, scale: float) -> None:
    # Execute
    clean, _ = _run(femnist, None)
    attacked, weights = _run(femnist, Faults(scale={INSIDER: scale}))

    # Assert: every round the insider alone was refused; the six others trained and were credited
    for rec in attacked:
        assert rec.rejected.get(INSIDER) == 1, rec.rejected
        assert rec.dropped.get(HOP_REASON) == 1
        assert rec.trained == 6
    assert weights is not None and np.isfinite(weights).all()
    drop = clean[-1].server_accuracy - attacked[-1].server_accuracy
    assert drop < 0.05, (clean[-1].server_accuracy, attacked[-1].server_accuracy)
    assert all(r.trained == 7 and not r.rejected for r in clean)


@pytest.mark.slow
def test_with_screening_off_the_guard_still_refuses_a_x1e30_hand_off(femnist) -> None:
    # Execute: screening off; the server's own update is the guard's scale from round 1
    attacked, weights = _run(femnist, Faults(scale={INSIDER: 1e30}), screening=None)

    # Assert: refused every round (1,000 times the reference), the chain went on and learned
    assert all(rec.rejected.get(INSIDER) == 1 and rec.trained == 6 for rec in attacked)
    assert weights is not None and np.isfinite(weights).all()
    assert attacked[-1].server_accuracy > attacked[0].server_accuracy
