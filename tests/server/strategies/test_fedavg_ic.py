"""FedAvg-IC and HierFAVG as the paper runs them (Lee et al., Alg. 1 and Sec. 6.1)."""

from __future__ import annotations

import numpy as np
import pytest

from server.strategies.fedavg_ic import FedAvgIC, HierFAVG
from tests.server.strategies.fakes import FakeContext, info, play_round

IDS = [f"c{i}" for i in range(6)]
COUNTS = {c: np.array([10.0 + i, 5.0]) for i, c in enumerate(IDS)}
STEP = {
    c: np.array([1.0, -1.0, 0.5 * i, 0.0]) if i < 3 else np.array([-1.0, 1.0, 0.0, 0.5 * i]) for i, c in enumerate(IDS)
}


def _trained(client: str, start: np.ndarray) -> np.ndarray:
    return start + STEP[client]


def _sites() -> np.ndarray:
    pos = np.repeat([0.0, 100.0], 3)
    return np.abs(pos[:, None] - pos[None, :])


def _setup(strategy: FedAvgIC) -> None:
    strategy.setup([info(c, v) for c, v in COUNTS.items()], np.zeros(4, np.float32), np.random.default_rng(0))


@pytest.mark.parametrize("cls", [FedAvgIC, HierFAVG])
def test_clients_are_scored_with_the_last_global_model_between_global_rounds(cls: type[FedAvgIC]) -> None:
    # Prepare: τ2 = 3, so the first grouped rounds end with group aggregations only
    strategy = cls(n_groups=2, tau2=3)
    _setup(strategy)
    ctx = FakeContext(COUNTS, distance=_sites())

    # Execute: two rounds; neither grouped round is global
    for rnd in (1, 2):
        _, extra = play_round(strategy, rnd, ctx, _trained)
        last_global = extra["global_aggregation"]
    assert strategy.global_weights is not None
    global_model = strategy.global_weights.copy()

    # Assert: the group models moved, but the method's output is the global model
    assert last_global == 0.0
    assert any(not np.array_equal(g, global_model) for g in strategy.group_models)
    for c in IDS:
        np.testing.assert_array_equal(strategy.model_for(c), global_model)


@pytest.mark.parametrize("cls", [FedAvgIC, HierFAVG])
def test_learning_steps_default_to_the_papers_tau1_1_tau2_5(cls: type[FedAvgIC]) -> None:
    # Prepare: Table 4 / Sec. 6.1 of FedAvg-IC: τ1 = 1, τ2 = 5
    strategy = cls(n_groups=2)
    _setup(strategy)
    ctx = FakeContext(COUNTS, distance=_sites())

    # Execute: play until the plan is grouped (round 1 for HierFAVG, round 2 for FedAvg-IC)
    plan, _ = play_round(strategy, 1, ctx, _trained)
    if not strategy.assignment:
        plan, _ = play_round(strategy, 2, ctx, _trained)

    # Assert: one local step per group aggregation, a global one every fifth
    assert (strategy.schedule.tau1, strategy.schedule.tau2) == (1, 5)
    assert plan.train.max_steps == 1


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        # FedAvg-IC: round 1 is ungrouped and global; grouped rounds start at round 2,
        # and every τ2-th grouped round (rounds 4 and 7) is global
        (FedAvgIC, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
        # HierFAVG groups by network from round 1: rounds 3 and 6 are global
        (HierFAVG, [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
    ],
)
def test_global_aggregations_count_from_the_first_grouped_round(cls: type[FedAvgIC], expected: list[float]) -> None:
    # Prepare
    strategy = cls(n_groups=2, tau2=3)
    _setup(strategy)
    ctx = FakeContext(COUNTS, distance=_sites())

    # Execute
    flags = [play_round(strategy, rnd, ctx, _trained)[1]["global_aggregation"] for rnd in range(1, 8)]

    # Assert
    assert flags == expected


def test_node_grouping_runs_once_with_one_steady_step_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sec. 6.1: K-MEDOID_GROUPING runs once, "the number of maximum steady steps was set to 1"."""
    # Prepare: a spy around the grouping function the strategy calls
    import server.strategies.fedavg_ic as module

    calls: list[int] = []
    real = module.fedavg_ic_groups

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs["max_iter"])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "fedavg_ic_groups", spy)
    default, explicit = FedAvgIC(n_groups=2), FedAvgIC(n_groups=2, max_steady_steps=4)

    # Execute
    for strategy in (default, explicit):
        _setup(strategy)
        ctx = FakeContext(COUNTS, distance=_sites())
        for rnd in range(1, 5):
            play_round(strategy, rnd, ctx, _trained)

    # Assert: grouped once per strategy, with at most 1 (then 4) iterations of lines 19-21
    assert calls == [1, 4]


def test_bad_steady_steps_are_refused() -> None:
    from server.errors import StrategyError

    with pytest.raises(StrategyError, match="max_steady_steps"):
        FedAvgIC(max_steady_steps=0)


@pytest.mark.slow
def test_fedavg_i_on_30_femnist_writers_does_not_collapse_and_the_papers_assignment_says_it_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: FedAvg-I (data alone) with 5 groups over 30 FEMNIST writers: on 2026-11-23
    # it grouped 26/1/1/1/1 for 5 of 5 seeds (issue 29)
    from covey.paths import femnist_dir
    from server.lab.edges import federation
    from server.paths import ensure_model
    from server.simulation.engine import Simulation
    from server.strategies.base import TrainConfig

    data, model = federation(femnist_dir(), [f"w{i:02d}" for i in range(30)]), ensure_model("mlp_femnist")

    def grouped(assignment: str) -> tuple[list[int], float]:
        strategy = FedAvgIC(5, train=TrainConfig(1, 10, 0.05, max_steps=5), alpha_comm=0.0, assignment=assignment)  # type: ignore[arg-type]
        records = Simulation(strategy, dict(data), model, seed=0, federated_eval_every=0).run(2)
        sizes = sorted(np.bincount(list(strategy.assignment.values())).tolist(), reverse=True)
        return sizes, records[1].extra["largest_group_share"]

    # Execute
    with caplog.at_level("WARNING", logger="covey.server"):
        balanced, balanced_share = grouped("balanced")
        assert "degenerated" not in caplog.text
        paper, paper_share = grouped("paper")

    # Assert: the default's groups are 6 each, recorded; the paper's collapse, warned of
    # and recorded (the share the record holds is the groups' own)
    assert balanced == [6, 6, 6, 6, 6] and balanced_share == pytest.approx(0.2)
    assert paper[0] > 15 and paper_share == pytest.approx(paper[0] / 30)
    assert "fedavg_ic's grouping degenerated: its largest group holds" in caplog.text
    assert "assignment 'paper'" in caplog.text


@pytest.mark.parametrize("cls", [FedAvgIC, HierFAVG])
def test_training_defaults_to_table_4_and_fedavg_ics_round_1_is_one_step(cls: type[FedAvgIC]) -> None:
    # Prepare: no training given: the paper's (Table 4: batch 128, η = 0.1, decay 0.99)
    strategy = cls(n_groups=2)
    _setup(strategy)

    # Execute: round 1's plan
    plan, _ = play_round(strategy, 1, FakeContext(COUNTS, distance=_sites()), _trained)

    # Assert: Table 4's training; round 1 one SGD step (Alg. 1 line 1: τ1 = τ2 = 1, for
    # FedAvg-IC's ungrouped start and HierFAVG's grouped first round alike)
    t = strategy.train
    assert (t.batch_size, t.lr, t.lr_decay) == (128, 0.1, 0.99)
    assert plan.train.max_steps == 1 and plan.train.batch_size == 128


def test_the_balanced_grouping_restarts_and_the_papers_runs_once() -> None:
    from server.errors import StrategyError
    from server.strategies.fedavg_ic import BALANCED_RESTARTS, FedAvgIC

    assert FedAvgIC().restarts == BALANCED_RESTARTS > 1
    assert FedAvgIC(assignment="paper").restarts == 1
    assert FedAvgIC(assignment="paper", restarts=4).restarts == 4
    with pytest.raises(StrategyError, match="not 'descent'"):
        FedAvgIC(assignment="descent", restarts=3)
    with pytest.raises(StrategyError, match="restarts must be a positive integer"):
        FedAvgIC(restarts=0)
