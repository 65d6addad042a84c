"""A round whose sampled devices all fail is planned again without them; it never ends
the run, and a run without failures never retries."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from device.protocol import EvalRow
from server.backend import EvalJob, RoundStats
from server.rounds import RoundDriver
from server.strategies import make_strategy, strategy_names
from server.strategies.base import ClientInfo, GroupResult, MemberResult, RoundPlan, TrainConfig
from tests.server.strategies.fakes import FakeContext, chain_results, parallel_results

IDS = [f"c{i}" for i in range(8)]
TRAIN = TrainConfig(1, 10, 0.1)


class FakeDevices:
    """A backend whose ``dead`` devices never answer; the others add 0.01 to their start model."""

    def __init__(self, dead: set[str], offline: frozenset[str] = frozenset()) -> None:
        self.dead = dead
        self.gone = offline  # known offline (a board's last will)
        self.plans: list[RoundPlan] = []
        rng = np.random.default_rng(0)
        self.counts = {c: rng.integers(1, 20, 4).astype(np.float64) for c in IDS}

    def clients(self) -> Sequence[ClientInfo]:
        return [ClientInfo(c, int(v.sum()), v, 5) for c, v in sorted(self.counts.items())]

    def before_round(self, rnd: int) -> dict[str, float]:
        return {}

    def execute(self, plan: RoundPlan, *, seed: int, hop: object = None) -> list[GroupResult]:
        self.plans.append(plan)
        out = []
        for g in plan.groups:
            alive = [c for c in g.members if c not in self.dead]
            skipped = tuple(c for c in g.members if c in self.dead)
            start = plan.models[g.start_model]
            if g.mode == "parallel":
                members = tuple(MemberResult(c, 10, 1.0, (start + 0.01).astype(np.float32)) for c in alive)
                out.append(GroupResult(g.group_id, members, None, skipped))
            else:
                final = (start + 0.01 * len(alive)).astype(np.float32)
                out.append(GroupResult(g.group_id, tuple(MemberResult(c, 10, 1.0) for c in alive), final, skipped))
        return out

    def pretrain(self, client_ids, weights, *, steps, batch, lr, seed, rnd):  # type: ignore[no-untyped-def]
        return {c: np.full_like(weights, float(IDS.index(c) % 3) - 1) for c in client_ids if c not in self.dead}

    def evaluate(self, jobs: Sequence[EvalJob], *, rnd: int) -> list[dict[str, list[EvalRow]]]:
        return [{c: [EvalRow(i, 1.0, 1, 2) for i in range(len(j.models))] for c in j.clients} for j in jobs]

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {c: self.counts[c] for c in client_ids}

    def snr_matrix(self) -> np.ndarray | None:
        return None

    def distance_matrix(self) -> np.ndarray | None:
        return None

    def site_edges(self) -> dict[str, str]:
        return {}

    def round_stats(self) -> RoundStats:
        return RoundStats()

    def offline(self) -> frozenset[str]:
        return self.gone


def _driver(
    strategy_name: str, dead: set[str], offline: frozenset[str] = frozenset(), **params: object
) -> tuple[RoundDriver, FakeDevices]:
    devices = FakeDevices(dead, offline)
    driver = RoundDriver(make_strategy(strategy_name, train=TRAIN, **params), devices, seed=3, federated_eval_every=0)
    driver.setup(np.zeros(6, np.float32))
    return driver, devices


def test_a_round_whose_sampled_devices_all_fail_is_planned_again_without_them() -> None:
    # Prepare: the devices FedAvg samples first in round 1 never answer
    probe, probe_devices = _driver("fedavg", set(), clients_per_round=3)
    probe.step()
    dead = set(probe_devices.plans[0].participants)
    driver, devices = _driver("fedavg", dead, clients_per_round=3)

    # Execute
    record = driver.step()

    # Assert
    first, second = devices.plans
    assert set(first.participants) == dead
    assert not dead & set(second.participants)  # the retry asked others
    assert record.extra["retries"] == 1 and record.extra["retry_excluded"] == 3
    assert record.trained == 3 and "failed_round" not in record.extra
    np.testing.assert_allclose(driver.strategy.global_weights, 0.01, rtol=1e-6)
    assert driver.strategy.unavailable == frozenset()  # set aside for the retry only


def test_when_every_attempt_fails_the_models_stay_and_the_run_goes_on() -> None:
    driver, devices = _driver("fedavg", set(IDS), clients_per_round=3)

    records = [driver.step(), driver.step()]

    assert len(devices.plans) == 2 * driver.max_attempts
    assert all(r.extra["failed_round"] == 1 and r.extra["retries"] == driver.max_attempts - 1 for r in records)
    np.testing.assert_array_equal(driver.strategy.global_weights, 0)
    assert all(np.isnan(r.train_loss) for r in records)


def test_a_retry_that_runs_out_of_devices_stops_asking() -> None:
    # 8 clients, 3 per round, all dead: the third plan has only 2 left, then none
    driver, devices = _driver("fedavg", set(IDS), clients_per_round=3)
    driver.max_attempts = 10

    record = driver.step()

    assert [len(p.participants) for p in devices.plans] == [3, 3, 2]
    assert record.extra["retries"] == 2 and record.extra["retry_excluded"] == 8


def test_chains_are_retried_when_every_chain_came_back_empty() -> None:
    probe, probe_devices = _driver("fedgsp", set(), beta=4, kappa=0.25, growth="linear", alpha=0.0)
    probe.step()
    dead = set(probe_devices.plans[0].participants)  # one chain of two
    driver, devices = _driver("fedgsp", dead, beta=4, kappa=0.25, growth="linear", alpha=0.0)

    record = driver.step()

    assert len(devices.plans) == 2 and not dead & set(devices.plans[1].participants)
    assert record.extra["retries"] == 1 and record.trained == 2


def test_a_run_without_failures_never_retries() -> None:
    driver, devices = _driver("fedavg", set(), clients_per_round=3)

    records = [driver.step() for _ in range(4)]

    assert len(devices.plans) == 4
    assert not any(k in r.extra for r in records for k in ("retries", "retry_excluded", "failed_round"))


@pytest.mark.parametrize("name", strategy_names())
def test_no_strategy_raises_on_a_round_where_nobody_returned_a_model(name: str) -> None:
    # Prepare: every strategy, driven over fake clients past its first round
    from tests.server.strategies.test_strategies import SETTINGS

    rng = np.random.default_rng(1)
    counts = {c: rng.integers(1, 20, 4) for c in [f"c{i:02d}" for i in range(30)]}
    updates = {c: rng.normal(0, 1, 6) for c in counts}
    ctx = FakeContext(counts, updates)
    strategy = make_strategy(name, train=TRAIN, **SETTINGS[name])
    strategy.setup(ctx.clients(), np.zeros(6, np.float32), np.random.default_rng(0))
    first = strategy.plan_round(1, ctx)
    strategy.aggregate(
        1,
        first,
        chain_results(first) if first.groups[0].mode == "chain" else parallel_results(first, lambda c, w: w + 0.1),
    )
    plan = strategy.plan_round(2, ctx)
    before = [m.copy() for m in [strategy.global_weights, *getattr(strategy, "group_models", [])]]

    # Execute: nobody answered
    empty = [
        GroupResult(g.group_id, (), plan.models[g.start_model] if g.mode == "chain" else None, g.members)
        for g in plan.groups
    ]
    summary = strategy.aggregate(2, plan, empty)

    # Assert: every model as it was
    after = [strategy.global_weights, *getattr(strategy, "group_models", [])]
    assert len(after) == len(before)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.isnan(summary.train_loss)


@pytest.mark.parametrize("name", ["fedavg", "fedgsp"])
def test_devices_known_offline_are_planned_around_and_asked_again_once_back(name: str) -> None:
    # Prepare: two boards whose last will said offline (they would never answer)
    gone = frozenset(IDS[:2])
    driver, devices = _driver(name, set(gone), gone, **({"clients_per_round": 4} if name == "fedavg" else {}))

    # Execute: a round while they are offline, then one after they came back
    first = driver.step()
    devices.gone = frozenset()
    devices.dead = set()
    for _ in range(6):
        driver.step()

    # Assert: no plan named them while offline, and the round needed no retry; back, they are asked
    assert not gone & set(devices.plans[0].participants) and len(devices.plans) == 7
    assert "retries" not in first.extra and first.skipped == 0 and first.trained > 0
    assert gone & {d for p in devices.plans[1:] for d in p.participants}
    assert driver.strategy.unavailable == frozenset()


def test_when_no_plan_does_without_the_offline_devices_everyone_is_asked() -> None:
    # Prepare: every device offline
    driver, devices = _driver("fedavg", set(), frozenset(IDS), clients_per_round=4)

    # Execute
    record = driver.step()

    # Assert: the round still ran, with everyone asked
    assert len(devices.plans[0].participants) == 4 and record.trained == 4
