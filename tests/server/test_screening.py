"""Screening what devices send: refusal and clipping against a reference (the round's
lower median, past rounds, the server's own update), in parallel groups, chains and
pre-training; counted per device in the round record."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from server.errors import StrategyError
from server.rounds import RoundDriver
from server.screening import (
    NORM_CHUNK,
    ScreeningConfig,
    lower_median,
    norm_outliers,
    reference_norm,
    screen_results,
    screen_updates,
    update_norm,
)
from server.strategies import make_strategy
from server.strategies.base import GroupPlan, GroupResult, MemberResult, RoundPlan, TrainConfig
from tests.server.test_retry import IDS, FakeDevices

START = np.zeros(4, np.float32)


def _parallel(updates: dict[str, float]) -> tuple[RoundPlan, list[GroupResult]]:
    plan = RoundPlan(1, (GroupPlan(0, tuple(updates), "parallel", "g"),), {"g": START})
    members = tuple(MemberResult(c, 10, 1.0, START + np.float32(u)) for c, u in updates.items())
    return plan, [GroupResult(0, members)]


@pytest.mark.parametrize("size", [0, 1, NORM_CHUNK - 1, NORM_CHUNK, 2 * NORM_CHUNK + 7])
def test_an_update_norm_is_the_float64_norm_of_the_exact_difference(size: int) -> None:
    """Chunk by chunk, across chunk ends, the norm is that of the whole float64
    difference: each float32 difference is exact in float64, and only the summation
    order differs."""
    rng = np.random.default_rng(size)
    start = rng.normal(size=size).astype(np.float32)
    model = (start + rng.normal(scale=1e-3, size=size)).astype(np.float32)
    model[: min(size, 3)] = np.float32(3e38) * np.sign(model[: min(size, 3)])  # squares beyond float32

    want = float(np.linalg.norm(model.astype(np.float64) - start.astype(np.float64)))

    assert update_norm(start, model) == pytest.approx(want, rel=1e-12, abs=0.0)
    with pytest.raises(ValueError, match="values"):
        update_norm(start, np.zeros(size + 1, np.float32))


def test_an_update_above_k_times_the_median_is_an_outlier() -> None:
    bad, median = norm_outliers([1.0, 1.2, 0.9, 30.0], factor=10)
    assert bad.tolist() == [False, False, False, True] and median == pytest.approx(1.1)
    assert not norm_outliers([1.0, 50.0], factor=10)[0].any()  # fewer than min_updates: no bound
    assert not norm_outliers([0.0, 0.0, 0.0, 5.0], factor=10)[0].any()  # a zero median scales nothing


def test_a_boosted_parallel_member_loses_its_model_and_is_named() -> None:
    # Prepare
    plan, results = _parallel({"a": 1.0, "b": 1.1, "c": 0.9, "p": 100.0})

    # Execute
    out = screen_results(plan, results, ScreeningConfig())

    # Assert
    kept = {m.client_id: m.weights is not None for m in out.results[0].members}
    assert kept == {"a": True, "b": True, "c": True, "p": False}  # p trained; its model is refused
    assert [(r.devices, r.kind) for r in out.rejections] == [(("p",), "member")]
    assert out.max_ratio == pytest.approx(100 / 1.0, rel=1e-5)  # the lower median of 0.9, 1, 1.1, 100 is 1


def test_a_chain_whose_delta_is_far_above_the_other_chains_is_refused() -> None:
    plan = RoundPlan(1, tuple(GroupPlan(g, (f"c{g}a", f"c{g}b"), "chain", "g") for g in range(4)), {"g": START})
    finals = [START + 1, START + 1.2, START + 0.8, START + 50]
    results = [
        GroupResult(g, (MemberResult(f"c{g}a", 5, 1), MemberResult(f"c{g}b", 5, 1)), f) for g, f in enumerate(finals)
    ]

    out = screen_results(plan, results, ScreeningConfig())

    assert [r.final_weights is not None for r in out.results] == [True, True, True, False]
    assert out.rejections[0].devices == ("c3a", "c3b") and out.rejections[0].kind == "chain"


def test_without_a_norm_factor_nothing_is_screened_or_clipped() -> None:
    plan, results = _parallel({"a": 1.0, "b": 1.1, "c": 0.9, "p": 100.0})
    out = screen_results(plan, results, ScreeningConfig(norm_factor=None))
    assert out.results == results and out.rejections == [] and out.clipped == []
    assert out.max_ratio == pytest.approx(100.0)  # measured all the same


def test_an_update_between_the_clip_and_the_refusal_bound_is_scaled_down_to_the_clip() -> None:
    # Prepare: b is 6 times the others: above the clip (3x), below the refusal (10x)
    plan, results = _parallel({"a": 1.0, "b": 6.0, "c": 1.0, "d": 1.0})

    # Execute
    out = screen_results(plan, results, ScreeningConfig(norm_factor=10.0, clip_factor=3.0))

    # Assert: b keeps its direction at 3 times the reference; the others are untouched
    models = {m.client_id: m.weights for m in out.results[0].members}
    np.testing.assert_allclose(models["b"], START + 3.0, rtol=1e-6)
    assert update_norm(START, models["b"]) == pytest.approx(6.0)  # 3 x the reference norm 2 (= ||1,1,1,1||)
    np.testing.assert_array_equal(models["a"], START + 1)
    assert [(d, k, round(f, 6)) for d, k, f in out.clipped] == [(("b",), "member", 0.5)]
    assert sorted(out.accepted["member"]) == pytest.approx([2.0, 2.0, 2.0, 2.0])  # history: at most the reference


def test_the_reference_is_the_lower_median_of_the_round_the_past_and_the_server() -> None:
    assert lower_median([3.0, 1.0, 2.0, 100.0]) == 2.0  # the smaller of the two middle values
    assert lower_median([5.0, 500.0]) == 5.0
    assert np.isnan(lower_median([]))
    assert np.isnan(reference_norm([1.0, 100.0], [], None, 3))  # too few entries: no bound
    assert reference_norm([1.0, 100.0], [1.2, 0.9], None, 3) == 1.0  # history fills in
    assert reference_norm([100.0], [], 1.0, 3) == 1.0  # the server's own update suffices


@pytest.mark.parametrize(
    ("past", "server"),
    [({"chain": [0.5, 0.55]}, None), ({}, 0.5)],
    ids=["past rounds", "the server's update"],
)
def test_one_boosted_chain_of_two_is_refused_with_history_or_the_servers_update(
    past: dict[str, list[float]], server: float | None
) -> None:
    """FedGSP's two chains a round on a small site: the round's median of two cannot tell
    a x100 chain from the honest one; the past rounds or the server's update can."""
    # Prepare: two chains of one member; per member norms 0.5 and 50
    plan = RoundPlan(3, tuple(GroupPlan(g, (f"m{g}",), "chain", "g") for g in range(2)), {"g": START})
    results = [
        GroupResult(0, (MemberResult("m0", 5, 1),), START + np.float32(0.25)),
        GroupResult(1, (MemberResult("m1", 5, 1),), START + np.float32(25.0)),
    ]

    # Execute
    out = screen_results(plan, results, ScreeningConfig(), past, server)
    alone = screen_results(plan, results, ScreeningConfig())

    # Assert
    assert [r.final_weights is not None for r in out.results] == [True, False]
    assert [r.devices for r in out.rejections] == [("m1",)]
    assert alone.rejections == [] and np.isnan(alone.max_ratio)  # the round alone: no reference


def test_a_chain_is_compared_per_member() -> None:
    """A chain of four honest members moves about twice as far as one member: per member
    (over the square root of its length) it is like the others, not clipped."""
    groups = (GroupPlan(0, ("a", "b", "c", "d"), "chain", "g"), GroupPlan(1, ("e",), "chain", "g"))
    plan = RoundPlan(1, groups, {"g": START})
    results = [
        GroupResult(0, tuple(MemberResult(c, 5, 1) for c in "abcd"), START + np.float32(1.0)),
        GroupResult(1, (MemberResult("e", 5, 1),), START + np.float32(0.5)),
    ]
    out = screen_results(plan, results, ScreeningConfig(), {"chain": [1.0]}, None)
    assert out.clipped == [] and out.rejections == []
    assert sorted(out.accepted["chain"]) == pytest.approx([1.0, 1.0])


def test_pretraining_updates_are_screened_alike() -> None:
    updates = {c: np.full(4, 1.0 + 0.1 * i, np.float32) for i, c in enumerate("abcd")}
    updates["p"] = np.full(4, 80.0, np.float32)

    kept, rejections = screen_updates(updates, ScreeningConfig())

    assert sorted(kept) == list("abcd") and rejections[0].devices == ("p",) and rejections[0].kind == "pretrain"
    np.testing.assert_array_equal(kept["a"], updates["a"])  # below the clip: unchanged


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"norm_factor": 1.0}, "above 1"),
        ({"clip_factor": 0.5}, "clip factor"),
        ({"clip_factor": 20.0}, "clip factor"),
        ({"history_rounds": -1}, "history_rounds"),
        ({"weight_cap": 0.5}, "weight cap"),
        ({"min_updates": 2}, ">= 3"),
        ({"aggregation": "mode"}, "aggregation must be one of"),
        ({"trim": 0.5}, r"\[0, 0.5\)"),
    ],
)
def test_bad_screening_settings_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        ScreeningConfig(**change)  # type: ignore[arg-type]


class PoisonedDevices(FakeDevices):
    """``c0`` returns its start model plus 5 instead of plus 0.01: 500 times the honest
    update, beyond screening's bound but within the guard's (1,000 times)."""

    def execute(self, plan, *, seed, hop=None):  # type: ignore[no-untyped-def]
        out = super().execute(plan, seed=seed)
        boosted = []
        for r in out:
            members = tuple(
                MemberResult(
                    m.client_id, m.n_samples, m.train_loss, m.weights + 5 if m.client_id == "c0" else m.weights
                )
                for m in r.members
            )
            boosted.append(GroupResult(r.group_id, members, r.final_weights, r.skipped))
        return boosted


@pytest.mark.parametrize("screening", [ScreeningConfig(), None])
def test_the_driver_refuses_the_poisoner_and_counts_it_per_device(screening: ScreeningConfig | None) -> None:
    # Prepare: every client trains every round; c0 poisons
    driver = RoundDriver(
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.1), clients_per_round=len(IDS)),
        PoisonedDevices(set()),
        seed=0,
        federated_eval_every=0,
        screening=screening,
    )
    driver.setup(np.zeros(6, np.float32))

    # Execute
    record = driver.step()

    # Assert
    model = driver.strategy.global_weights
    if screening is None:
        assert record.rejected == {} and float(model.max()) > 0.5  # the mean moved far
    else:
        assert record.rejected == {"c0": 1}
        assert record.dropped == {"screened: update norm": 1}
        assert record.trained == len(IDS)
        np.testing.assert_allclose(model, 0.01, rtol=1e-5)  # the honest mean


def test_the_driver_sets_the_strategys_aggregation_rule() -> None:
    driver = RoundDriver(
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.1), clients_per_round=len(IDS)),
        PoisonedDevices(set()),
        seed=0,
        federated_eval_every=0,
        screening=ScreeningConfig(norm_factor=None, aggregation="median"),
    )
    driver.setup(np.zeros(6, np.float32))

    record = driver.step()

    assert driver.strategy.aggregation == "median"
    np.testing.assert_allclose(driver.strategy.global_weights, 0.01, rtol=1e-5)  # the median ignores c0
    assert record.rejected == {}


class EmptyHandedDevices(FakeDevices):
    """``c0`` claims it trained on no samples but returns a model."""

    def execute(self, plan, *, seed, hop=None):  # type: ignore[no-untyped-def]
        out = super().execute(plan, seed=seed)
        return [
            GroupResult(
                r.group_id,
                tuple(
                    MemberResult(m.client_id, 0 if m.client_id == "c0" else m.n_samples, m.train_loss, m.weights)
                    for m in r.members
                ),
                r.final_weights,
                r.skipped,
            )
            for r in out
        ]


@pytest.mark.parametrize("name", ["dsc", "fedavg"])
def test_a_model_trained_on_no_samples_is_left_out_instead_of_ending_the_run(name: str) -> None:
    # Prepare: DSC's Eq. 4 refused a zero sample count with an error that ended the run
    driver = RoundDriver(
        make_strategy(name, train=TrainConfig(1, 10, 0.1), clients_per_round=len(IDS)),
        EmptyHandedDevices(set()),
        seed=0,
        federated_eval_every=0,
        screening=None,
    )
    driver.setup(np.zeros(6, np.float32))

    # Execute
    record = driver.step()

    # Assert
    assert record.rejected == {"c0": 1} and record.dropped == {"screened: no samples": 1}
    np.testing.assert_allclose(driver.strategy.global_weights, 0.01, rtol=1e-5)


def test_a_norm_the_server_measured_on_receipt_is_the_one_screened() -> None:
    """``MemberResult.norm`` (the simulator measures it on the worker that trained the
    member) stands for the update's norm: screening does not compute it again."""
    plan, results = _parallel({"a": 1.0, "b": 1.1, "c": 0.9, "d": 1.0})
    measured = [replace(m, norm=100.0 if m.client_id == "d" else None) for m in results[0].members]

    out = screen_results(plan, [GroupResult(0, tuple(measured))], ScreeningConfig())

    assert [(r.devices, r.norm) for r in out.rejections] == [(("d",), 100.0)]
    assert {m.client_id for m in out.results[0].members if m.weights is None} == {"d"}
