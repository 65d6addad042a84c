"""Aggregation rules: FedAvg, server optimizers (by hand), inter-group, DSC weights."""

from __future__ import annotations

import numpy as np
import pytest

from server.aggregation.dsc_weights import angle_weights, size_weights
from server.aggregation.fedavg import weighted_average
from server.aggregation.hierarchical import HierarchicalSchedule
from server.aggregation.intergroup import intergroup_aggregate
from server.aggregation.server_opt import ServerOptimizer
from server.errors import GroupingError


def test_weighted_average_across_cache_blocks_matches_float64_reference() -> None:
    rng = np.random.default_rng(3)
    models = [rng.normal(size=(3, 70_001)).astype(np.float32) for _ in range(7)]  # spans several blocks
    weights = [5.0, 0.0, 1.0, 2.5, 9.0, 3.0, 1.0]
    reference = np.tensordot(weights, np.stack(models).astype(np.float64), axes=1) / sum(weights)
    out = weighted_average(models, weights)
    assert out.shape == (3, 70_001) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference, rtol=1e-6, atol=1e-7)


def test_weighted_average_and_identical_models() -> None:
    a, b = np.array([0.0, 4.0], np.float32), np.array([2.0, 0.0], np.float32)
    np.testing.assert_allclose(weighted_average([a, b], [3, 1]), [0.5, 3.0])
    m = np.random.default_rng(0).normal(size=500).astype(np.float32)
    np.testing.assert_array_equal(weighted_average([m, m, m], [1, 2, 3]), m)


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi"])
def test_server_optimizers_match_a_hand_computation(kind: str) -> None:
    # Prepare: x = [1, -1], two rounds with updates d1, d2; η = 0.1, β1 = 0.9, β2 = 0.99, τ = 1e-3
    opt = ServerOptimizer(kind, lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    x = np.array([1.0, -1.0])
    d1, d2 = np.array([0.2, -0.4]), np.array([-0.1, 0.3])

    # Execute
    x1 = opt.step(x, d1)
    x2 = opt.step(x1, d2)

    # Assert: Reddi et al. 2021, Algorithm 2, written out
    m, v = np.zeros(2), np.full(2, 1e-6)
    xs = x.copy()
    for d in (d1, d2):
        m = 0.9 * m + 0.1 * d
        if kind == "adagrad":
            v = v + d * d
        elif kind == "adam":
            v = 0.99 * v + 0.01 * d * d
        else:
            v = v - 0.01 * d * d * np.sign(v - d * d)
        xs = xs + 0.1 * m / (np.sqrt(v) + 1e-3)
    np.testing.assert_allclose(x2, xs, rtol=1e-6)
    # first Adam step by hand: m = 0.02, v = 0.99e-6 + 0.0004 -> x += 0.1*0.02/(0.0200247+0.001)
    if kind == "adam":
        assert x1[0] == pytest.approx(1 + 0.1 * 0.02 / (np.sqrt(0.99e-6 + 0.01 * 0.04) + 1e-3), rel=1e-6)


def test_intergroup_aggregation_forms() -> None:
    w1, w2 = np.array([3.0, 4.0]), np.array([0.0, 2.0])
    paper = intergroup_aggregate([w1, w2], 0.5)
    convex = intergroup_aggregate([w1, w2], 0.5, convex=True)
    np.testing.assert_allclose(paper[0], w1 + 0.5 * w2 / 2.0)
    np.testing.assert_allclose(paper[1], w2 + 0.5 * w1 / 5.0)
    np.testing.assert_allclose(convex[0], (w1 + 0.25 * w2) / 1.25)
    np.testing.assert_array_equal(intergroup_aggregate([w1, w2], 0.0)[0], w1)
    same = intergroup_aggregate([w1, w1, w1], 0.3, convex=True)
    np.testing.assert_allclose(same[1], w1)


def test_dsc_weights_by_hand() -> None:
    grads = np.array([[1.0, 0.0], [0.0, 1.0]])
    w = angle_weights(grads, np.array([1.0, 1.0]))
    np.testing.assert_allclose(w, [0.5, 0.5])  # symmetric: equal angles to the mean
    aligned = angle_weights(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), np.ones(3))
    assert aligned[0] == aligned[1] > aligned[2]
    np.testing.assert_allclose(size_weights(np.array([10, 30])), [0.25, 0.75])


def test_hierarchical_schedule_and_bad_input() -> None:
    sched = HierarchicalSchedule(tau1=5, tau2=3)
    assert [sched.is_global_round(r) for r in range(1, 7)] == [False, False, True, False, False, True]
    with pytest.raises(GroupingError, match="zero models"):
        weighted_average([])
    with pytest.raises(GroupingError, match="shape"):
        weighted_average([np.zeros(2), np.zeros(3)])
    with pytest.raises(GroupingError, match="unknown server optimizer"):
        ServerOptimizer("sgd")
    with pytest.raises(GroupingError, match="τ1"):
        HierarchicalSchedule(0, 1)
