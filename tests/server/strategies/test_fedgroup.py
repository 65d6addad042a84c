"""FedGroup / FedGrouProx / FlexCFL strategies, driven round by round through a fake context."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import StrategyError
from server.strategies.base import RoundPlan
from server.strategies.fedgroup import FedGroup, FedGrouProx, FlexCFL
from tests.server.strategies.fakes import FakeContext, info, play_round


def _with_group_models(strategy: FedGroup, models: list[np.ndarray]) -> FedGroup:
    strategy.setup([info("a", np.ones(2)), info("b", np.ones(2))], models[0], np.random.default_rng(0))
    strategy.group_models = [np.asarray(m, np.float32) for m in models]
    return strategy


def _aggregate_empty_rounds(strategy: FedGroup, rounds: int) -> list[float]:
    """Rounds in which no group trained: only the inter-group aggregation acts."""
    norms = []
    for rnd in range(1, rounds + 1):
        strategy.aggregate(rnd, RoundPlan(rnd, (), {}), [])
        norms.append(max(float(np.linalg.norm(m)) for m in strategy.group_models))
    return norms


@pytest.mark.parametrize("cls", [FedGroup, FedGrouProx, FlexCFL])
def test_default_intergroup_aggregation_keeps_norms_bounded(cls: type[FedGroup]) -> None:
    # Prepare: w = [1, 0], [0, 1] and η_g = 5 (FlexCFL Table 4's η_g)
    strategy = _with_group_models(cls(n_groups=2, eta_g=5.0), [np.array([1.0, 0.0]), np.array([0.0, 1.0])])

    # Execute
    _aggregate_empty_rounds(strategy, 1)
    first = [m.copy() for m in strategy.group_models]
    norms = _aggregate_empty_rounds(strategy, 9)

    # Assert: the published code's convex form, (w_j + Σ η/‖w_l‖ w_l) / (1 + Σ η/‖w_l‖):
    # [1/6, 5/6] and [5/6, 1/6], and every later model is a convex combination of
    # earlier ones, so no norm exceeds the largest starting norm (1)
    np.testing.assert_allclose(first[0], [1 / 6, 5 / 6], rtol=1e-6)
    np.testing.assert_allclose(first[1], [5 / 6, 1 / 6], rtol=1e-6)
    assert max(norms) <= 1.0 + 1e-6


def test_literal_equation_20_grows_without_bound() -> None:
    # Prepare
    strategy = _with_group_models(
        FlexCFL(n_groups=2, eta_g=5.0, eta_g_form="literal"), [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    )

    # Execute
    first = _aggregate_empty_rounds(strategy, 1)
    np.testing.assert_allclose(strategy.group_models[0], [1.0, 5.0])
    np.testing.assert_allclose(strategy.group_models[1], [5.0, 1.0])
    _aggregate_empty_rounds(strategy, 1)
    second = [m.copy() for m in strategy.group_models]
    later = _aggregate_empty_rounds(strategy, 8)

    # Assert: [1, 5], [5, 1], then about [5.9, 6.0], and on: each round adds about η_g
    np.testing.assert_allclose(second[0], [1 + 25 / np.sqrt(26), 5 + 5 / np.sqrt(26)], rtol=1e-5)
    assert first[0] == pytest.approx(np.sqrt(26))
    assert later[-1] > 40.0


def test_unknown_intergroup_form_is_refused() -> None:
    with pytest.raises(StrategyError, match="eta_g_form"):
        FedGroup(eta_g_form="paper")  # type: ignore[arg-type]


IDS = [f"c{i}" for i in range(6)]
DIRECTION = {"A": np.array([1.0, 0.1, 0.0, 0.0]), "B": np.array([0.0, 0.1, 1.0, 0.0])}


def _flexcfl_with_everyone_warm() -> tuple[FlexCFL, FakeContext]:
    """Six clients, three with update direction A and three with B, all cold-started in round 1."""
    rng = np.random.default_rng(1)
    updates = {c: DIRECTION["A" if i < 3 else "B"] + rng.normal(0, 0.01, 4) for i, c in enumerate(IDS)}
    ctx = FakeContext({c: np.array([50.0, 50.0, 0.0, 0.0]) for c in IDS}, updates)
    strategy = FlexCFL(n_groups=2, clients_per_round=2, alpha=3, pretrain_steps=1, warmup="none")
    strategy.setup(ctx.clients(), np.full(4, 0.5, np.float32), np.random.default_rng(0))
    play_round(strategy, 1, ctx, lambda c, w: w + 0.01)
    return strategy, ctx


def test_flexcfl_migrates_every_shifted_warm_client_selected_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: everyone warm; c0 and c1 (direction A) now hold different labels and
    # would pre-train towards B; round 2 selects only c5, which did not change
    strategy, ctx = _flexcfl_with_everyone_warm()
    assert set(strategy.assignment) == set(IDS)
    before = dict(strategy.assignment)
    for c in ("c0", "c1"):
        ctx.counts[c] = np.array([0.0, 50.0, 50.0, 0.0])
        ctx.updates[c] = DIRECTION["B"]
    monkeypatch.setattr(strategy.sampler, "select", lambda rnd, ids, rng, **_: ["c5"])
    ctx.count_calls.clear()

    # Execute
    plan, extra = play_round(strategy, 2, ctx, lambda c, w: w + 0.01)

    # Assert: Alg. 2 lines 4-7 check all warm clients before selection (line 8) and
    # re-cold-start each one that moved, although neither was selected
    assert plan.participants == ["c5"]
    assert sorted(IDS) in [sorted(call) for call in ctx.count_calls]
    assert extra["migrated"] == 2.0 and strategy.migrations == 2
    for c in ("c0", "c1"):
        assert strategy.assignment[c] == before["c5"] != before[c]
    np.testing.assert_array_equal(strategy.grouped_counts["c0"], [0.0, 50.0, 50.0, 0.0])

    # and a third round sees nothing new to migrate
    _, extra = play_round(strategy, 3, ctx, lambda c, w: w + 0.01)
    assert extra["migrated"] == 0.0
