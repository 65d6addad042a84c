"""Claimed sample counts never buy weight: bounded by the registration and the population."""

from __future__ import annotations

import numpy as np
import pytest

from server.claims import bound_claims, population_cap
from server.rounds import RoundDriver
from server.screening import ScreeningConfig
from server.strategies import make_strategy
from server.strategies.base import ClientInfo, GroupResult, MemberResult, TrainConfig
from tests.server.test_retry import IDS, FakeDevices


def test_a_count_above_the_registration_is_cut_to_it_and_named() -> None:
    results = [GroupResult(0, (MemberResult("a", 10**9, 1.0), MemberResult("b", 100, 1.0)))]
    out = bound_claims(results, {"a": 120, "b": 100, "c": 130}, weight_cap=None)
    assert [m.n_samples for m in out.results[0].members] == [120, 100]
    assert out.overclaimed == ["a"] and out.capped == 0


def test_the_population_cap_is_a_multiple_of_the_upper_quartile_of_registrations() -> None:
    # a registered 10**9 (as a liar would from the start): the quartile of the others rules
    registered = {"a": 10**9, "b": 100, "c": 120, "d": 140, "e": 130, "f": 110, "g": 150}
    assert population_cap(registered, 2.0) == pytest.approx(2 * 145.0)  # 75th percentile of the 7
    results = [GroupResult(0, tuple(MemberResult(c, n, 1.0) for c, n in registered.items()))]
    out = bound_claims(results, registered, weight_cap=2.0)
    assert [m.n_samples for m in out.results[0].members] == [290, 100, 120, 140, 130, 110, 150]
    assert out.overclaimed == [] and out.capped == 1
    assert population_cap(registered, None) == float("inf")


class LyingDevices(FakeDevices):
    """``c0`` registered 10**9 samples and returns a model 4x away from everyone else's."""

    def clients(self):  # type: ignore[no-untyped-def]
        return [
            ClientInfo(c, 10**9, v * 0 + 10**9 / 4, 5) if c == "c0" else ClientInfo(c, 10, v, 5)
            for c, v in sorted(self.counts.items())
        ]

    def execute(self, plan, *, seed, hop=None):  # type: ignore[no-untyped-def]
        out = super().execute(plan, seed=seed)
        return [
            GroupResult(
                r.group_id,
                tuple(
                    MemberResult(m.client_id, 10**9, 1.0, m.weights - 0.05) if m.client_id == "c0" else m
                    for m in r.members
                ),
            )
            for r in out
        ]


HONEST = len(IDS) - 1


@pytest.mark.parametrize(
    ("cap", "expected"),
    [(2.0, (HONEST * 10 * 0.01 - 20 * 0.04) / (HONEST * 10 + 20)), (None, -0.04)],
    ids=["capped at 2 medians", "no cap"],
)
def test_the_driver_weighs_a_liar_at_most_the_cap(cap: float | None, expected: float) -> None:
    # Prepare: the honest devices (10 samples each) move +0.01; the liar moves -0.04 (below the clip)
    driver = RoundDriver(
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.1), clients_per_round=len(IDS)),
        LyingDevices(set()),
        seed=0,
        federated_eval_every=0,
        screening=ScreeningConfig(weight_cap=cap, clip_factor=None),
    )
    driver.setup(np.zeros(6, np.float32))

    # Execute
    record = driver.step()

    # Assert: with the cap the liar weighs 2 honest devices (2 x the quartile 10); without, it is the mean
    np.testing.assert_allclose(driver.strategy.global_weights, expected, rtol=1e-4, atol=1e-7)
    assert record.extra.get("weights_capped", 0) == (1 if cap else 0)


def test_strategies_group_by_bounded_registrations() -> None:
    # Prepare: four honest registrations of 100-400 samples and a liar of 10^9
    from server.claims import bounded_infos
    from server.strategies.base import ClientInfo

    honest = [ClientInfo(f"h{i}", n, np.array([n // 2, n - n // 2])) for i, n in enumerate((100, 200, 300, 400))]
    liar = ClientInfo("liar", 10**9, np.array([10**9 - 5, 5]))

    # Execute
    seen = {c.client_id: c for c in bounded_infos([*honest, liar], weight_cap=2.0)}

    # Assert: honest ones as registered; the liar at 2 x the upper quartile (of the five),
    # its class proportions kept and its counts still summing to its count
    cap = int(2.0 * np.percentile([100, 200, 300, 400, 10**9], 75))
    assert all(seen[c.client_id] is c for c in honest)
    assert seen["liar"].n_samples == cap == int(seen["liar"].class_counts.sum())
    assert seen["liar"].class_counts[1] <= 1
    assert bounded_infos([liar], weight_cap=None) == [liar]  # no cap: as registered


def test_the_strategy_sees_bounded_registrations_from_the_driver() -> None:
    driver = RoundDriver(
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.1), clients_per_round=len(IDS)),
        LyingDevices(set()),
        seed=0,
        federated_eval_every=0,
        screening=ScreeningConfig(),
    )
    driver.setup(np.zeros(6, np.float32))
    seen = {c.client_id: c.n_samples for c in driver.context.clients()}
    assert seen["c0"] == 20 and all(seen[c] == 10 for c in IDS if c != "c0")  # 2 x the upper quartile
    assert driver.strategy.clients["c0"].n_samples == 20  # what setup gave the strategy
    driver.add_client(ClientInfo("c0", 10**9, np.full(4, 10**9 // 4)))  # registering again: bounded again
    assert driver.strategy.clients["c0"].n_samples == 20
