"""FedGSP and its ablations NaiveGSP / NaiveGSP+ICG (Zeng et al. 2022), driven through a fake context."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import StrategyError
from server.grouping.icg import icg_groups
from server.strategies.fedgsp import FedGSP, NaiveGSP, NaiveGSPICG
from tests.server.strategies.fakes import FakeContext, chain_results, info


def _counts(n: int = 24, classes: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"c{i:02d}": rng.integers(0, 20, classes).astype(np.float64) + 1 for i in range(n)}


def _setup(strategy: FedGSP, counts: dict[str, np.ndarray], seed: int = 5) -> FakeContext:
    ctx = FakeContext(counts)
    strategy.setup(ctx.clients(), np.zeros(3, np.float32), np.random.default_rng(seed))
    return ctx


@pytest.mark.parametrize("cls", [FedGSP, NaiveGSPICG])
def test_icg_draw_reaches_icg_groups(cls: type[FedGSP], monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a spy around the ICG function the strategy calls
    import server.strategies.fedgsp as module

    draws: list[str] = []

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        draws.append(kwargs["draw"])
        return icg_groups(*args, **kwargs)

    monkeypatch.setattr(module, "icg_groups", spy)
    counts = _counts()

    # Execute
    for draw in ("balanced", "random"):
        strategy = cls(beta=4, kappa=1.0, icg_draw=draw)  # type: ignore[arg-type]
        strategy.plan_round(1, _setup(strategy, counts))
    default = cls(beta=4, kappa=1.0)
    default.plan_round(1, _setup(default, counts))

    # Assert
    assert draws == ["balanced", "random", "balanced"]


def test_random_icg_draw_gives_the_papers_groups() -> None:
    """Alg. 2 line 6: one client drawn at random from every cluster per group."""
    # Prepare
    counts = _counts()
    ids = sorted(counts)
    strategy = FedGSP(beta=4, kappa=1.0, grow=False, icg_draw="random")
    ctx = _setup(strategy, counts, seed=5)
    paper, _, _ = icg_groups(
        np.array([counts[c] for c in ids]), 4, max_iter=10, draw="random", random_state=np.random.default_rng(5)
    )

    # Execute
    plan = strategy.plan_round(1, ctx)

    # Assert: the same groups as Algorithm 2 with the random draw, from the same generator
    assert {frozenset(g.members) for g in plan.groups} == {frozenset(ids[i] for i in g) for g in paper}


def test_unknown_icg_draw_is_refused() -> None:
    with pytest.raises(StrategyError, match="icg_draw"):
        FedGSP(icg_draw="greedy")  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [NaiveGSP, NaiveGSPICG])
def test_naive_gsp_keeps_its_groups_and_chain_order(cls: type[FedGSP]) -> None:
    """FedGSP Sec. 4.1/4.2: NaiveGSP(+ICG) assigns clients to fixed groups; its training
    mode "is static, it may learn the client order". κ sampling still happens each round."""
    # Prepare: 4 groups, 3 of them trained per round
    strategy = cls(beta=4, kappa=0.75)
    ctx = _setup(strategy, _counts())

    # Execute
    plans = []
    for rnd in range(1, 6):
        plan = strategy.plan_round(rnd, ctx)
        strategy.aggregate(rnd, plan, chain_results(plan))
        plans.append({g.group_id: g.members for g in plan.groups})

    # Assert: every group trained in rounds 1 and 5 has the same members in the same order
    first, fifth = plans[0], plans[4]
    common = set(first) & set(fifth)
    assert len(first) == len(fifth) == 3 and len(common) >= 2
    for g in common:
        assert fifth[g] == first[g]
    assert len({frozenset(p) for p in plans}) > 1  # which groups train still varies


def test_fedgsp_itself_regroups_and_reshuffles_every_round() -> None:
    # Prepare: a fixed number of groups, all of them trained, so rounds are comparable
    strategy = FedGSP(beta=4, kappa=1.0, grow=False)
    ctx = _setup(strategy, _counts())

    # Execute
    orders = []
    for rnd in (1, 2):
        plan = strategy.plan_round(rnd, ctx)
        strategy.aggregate(rnd, plan, chain_results(plan))
        orders.append({g.members for g in plan.groups})

    # Assert
    assert orders[0] != orders[1]


@pytest.mark.parametrize("cls", [NaiveGSP, NaiveGSPICG])
def test_a_newcomer_joins_the_end_of_the_smallest_static_group(cls: type[FedGSP]) -> None:
    # Prepare: 23 clients in 4 groups (6, 6, 6, 5), every group trained
    counts = _counts(23)
    strategy = cls(beta=4, kappa=1.0)
    ctx = _setup(strategy, counts)
    plan = strategy.plan_round(1, ctx)
    strategy.aggregate(1, plan, chain_results(plan))
    before = {g.group_id: g.members for g in plan.groups}
    smallest = min(before, key=lambda g: len(before[g]))

    # Execute
    ctx.counts["new"] = np.ones(6)
    strategy.add_client(info("new", np.ones(6)))
    after = {g.group_id: g.members for g in strategy.plan_round(2, ctx).groups}

    # Assert
    assert after[smallest] == (*before[smallest], "new")
    assert all(after[g] == before[g] for g in before if g != smallest)


def test_a_small_site_records_f_r_and_the_groups_icg_formed_for_it() -> None:
    # Prepare: 3 clients, β = 2: f(1) = 2, but Algorithm 2's layout forms three groups of
    # one; a newcomer registers while the round runs
    strategy = FedGSP(beta=2, kappa=0.5)
    ctx = _setup(strategy, _counts(n=3))
    plan = strategy.plan_round(1, ctx)
    strategy.add_client(info("c99", np.ones(6)))

    # Execute
    summary = strategy.aggregate(1, plan, chain_results(plan))

    # Assert: f(1) and the groups formed as planned; round(0.5 x 3) = 2 of them ran
    assert (summary.extra["f_r"], summary.extra["groups_formed"]) == (2.0, 3.0)
    assert summary.n_groups == len(plan.groups) == 2


def test_a_fedgsp_restored_from_a_checkpoint_older_than_its_round_fields_still_aggregates() -> None:
    # Prepare: a strategy as a checkpoint written before f_r was kept rebuilds it (its
    # saved attributes only, on an object made without __init__)
    strategy = FedGSP(beta=2, kappa=0.5)
    ctx = _setup(strategy, _counts(n=6))
    plan = strategy.plan_round(1, ctx)
    old = object.__new__(FedGSP)
    old.__dict__.update({k: v for k, v in strategy.__dict__.items() if k not in ("last_f_r", "last_formed")})

    # Execute
    summary = old.aggregate(1, plan, chain_results(plan))

    # Assert
    assert summary.extra["f_r"] == 2.0 and summary.extra["groups_formed"] == 2.0
