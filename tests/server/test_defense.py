"""The guard on the aggregate: a global model that is not finite or explodes is never applied,
screening on or off (one x10^30 update froze an unscreened run for good)."""

from __future__ import annotations

import numpy as np
import pytest

from server.defense import AGGREGATE_REASON, Defense
from server.rounds import RoundDriver
from server.screening import ScreeningConfig
from server.strategies import make_strategy
from server.strategies.base import GroupResult, MemberResult, TrainConfig
from tests.server.test_retry import IDS, FakeDevices


class HugeDevices(FakeDevices):
    """``c0`` returns its start model plus ``boost`` in round 1 only; honest afterwards."""

    def __init__(self, boost: float) -> None:
        super().__init__(set())
        self.boost = boost

    def execute(self, plan, *, seed, hop=None):  # type: ignore[no-untyped-def]
        out = super().execute(plan, seed=seed)
        if plan.round != 1:
            return out
        return [
            GroupResult(
                r.group_id,
                tuple(
                    MemberResult(m.client_id, m.n_samples, 1.0, (m.weights + np.float32(self.boost)).astype(np.float32))
                    if m.client_id == "c0" and m.weights is not None
                    else m
                    for m in r.members
                ),
            )
            for r in out
        ]


@pytest.mark.parametrize("boost", [1e30, float("inf")], ids=["x1e30", "infinite"])
def test_without_screening_an_exploding_update_is_refused_and_the_run_goes_on(boost: float) -> None:
    # Prepare
    driver = RoundDriver(
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.1), clients_per_round=len(IDS)),
        HugeDevices(boost),
        seed=0,
        federated_eval_every=0,
        screening=None,
    )
    driver.setup(np.zeros(6, np.float32))

    # Execute: the poisoned round, then an honest one
    first = driver.step()
    after_first = driver.strategy.global_weights.copy()
    second = driver.step()

    # Assert: the x1e30 update (beyond the guard's 1,000 times the round's median) or the
    # infinite model itself was refused, not the aggregate of the others: the run moved
    # on in round 1 already (one x10^30 update used to freeze such a run for good)
    assert first.rejected == {"c0": 1} and AGGREGATE_REASON not in first.dropped
    np.testing.assert_allclose(after_first, 0.01, rtol=1e-5)
    assert AGGREGATE_REASON not in second.dropped
    np.testing.assert_allclose(driver.strategy.global_weights, after_first + 0.01, rtol=1e-5)


def test_the_guard_without_history_bounds_by_the_models_own_norm() -> None:
    guard = Defense(ScreeningConfig())
    before = np.ones(4, np.float32)
    assert guard.guard(before, before + 1) is None  # moved 2, the model's norm is 2: fine
    assert "model's norm" in str(guard.guard(before, before + 100))
    assert "NaN" in str(guard.guard(before, np.full(4, np.nan, np.float32)))
