"""FeSEM as FlexCFL's public code runs it (issue 29): independent random centres, and
each round's clients assigned before they train from their previous parameters;
covey's earlier order kept as ``variant="perturbed"``."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import StrategyError
from server.strategies import make_strategy
from server.strategies.base import GroupResult, MemberResult
from server.strategies.fesem import FeSEM, independent_copies
from tests.server.strategies.fakes import FakeContext, info

# a model of two tensors: a 3 x 2 kernel (Glorot-like values) and 2 zero biases
KERNEL = np.array([0.5, -0.4, 0.3, -0.2, 0.1, 0.45], np.float32)
INITIAL = np.concatenate([KERNEL, np.zeros(2, np.float32)])


def clients(n: int = 4) -> list:
    return [info(f"c{i}", np.array([10.0 * (i + 1)])) for i in range(n)]


def context() -> FakeContext:
    return FakeContext({c.client_id: c.class_counts for c in clients()})


def test_independent_centres_redraw_each_tensor_and_keep_zero_biases() -> None:
    # Execute
    copies = independent_copies(INITIAL, (6, 2), 3, np.random.default_rng(0))

    # Assert: each kernel holds the initial kernel's values in another order, biases stay 0
    assert len(copies) == 3
    for c in copies:
        np.testing.assert_array_equal(np.sort(c[:6]), np.sort(KERNEL))
        np.testing.assert_array_equal(c[6:], 0.0)
    assert not np.array_equal(copies[0], copies[1]) and not np.array_equal(copies[0], INITIAL)


def test_without_a_layout_the_whole_vector_is_one_tensor() -> None:
    copies = independent_copies(INITIAL, (), 2, np.random.default_rng(1))
    np.testing.assert_array_equal(np.sort(copies[0]), np.sort(INITIAL))
    copies = independent_copies(INITIAL, (3, 3), 1, np.random.default_rng(1))  # sizes do not add up
    np.testing.assert_array_equal(np.sort(copies[0]), np.sort(INITIAL))


def test_the_public_variant_is_the_default_and_starts_centres_independently() -> None:
    # Prepare
    strategy = make_strategy("fesem", n_groups=3, clients_per_round=4)
    strategy.tensor_sizes = (6, 2)

    # Execute
    strategy.setup(clients(), INITIAL, np.random.default_rng(0))

    # Assert: not 1 % perturbations of the start, but its values redrawn per tensor
    assert isinstance(strategy, FeSEM) and strategy.variant == "public"
    for centre in strategy.group_models:
        np.testing.assert_array_equal(np.sort(centre[:6]), np.sort(KERNEL))
        assert np.abs(centre - INITIAL).max() > 0.05


def test_round_one_puts_every_client_in_the_centre_nearest_the_initial_model() -> None:
    # Prepare: three centres, the second placed on the initial model
    strategy = FeSEM(n_groups=3, clients_per_round=4)
    strategy.setup(clients(), INITIAL, np.random.default_rng(0))
    strategy.group_models[1] = INITIAL.copy()

    # Execute
    plan = strategy.plan_round(1, context())

    # Assert: assigned before training from their previous (initial) parameters
    assert [(g.group_id, sorted(g.members)) for g in plan.groups] == [(1, ["c0", "c1", "c2", "c3"])]
    np.testing.assert_array_equal(plan.models["group1"], INITIAL)


def test_a_client_is_assigned_from_the_model_it_last_trained_to() -> None:
    # Prepare: round 1 puts all four in centre 1; c0 and c1 then train towards centre 2
    strategy = FeSEM(n_groups=3, clients_per_round=4)
    strategy.setup(clients(), INITIAL, np.random.default_rng(0))
    strategy.group_models[1] = INITIAL.copy()
    plan = strategy.plan_round(1, context())
    far = strategy.group_models[2] + 0.01
    members = tuple(
        MemberResult(c, 10 * (i + 1), 1.0, far if c in ("c0", "c1") else INITIAL.copy())
        for i, c in enumerate(plan.groups[0].members)
    )

    # Execute
    strategy.aggregate(1, plan, [GroupResult(1, members)])
    second = strategy.plan_round(2, context())

    # Assert: centre 1 took the members' sample-weighted mean; c0 and c1 moved to centre 2
    sizes = np.array([10.0, 20.0, 30.0, 40.0])
    expected = (sizes[:2].sum() * far + sizes[2:].sum() * INITIAL) / sizes.sum()
    np.testing.assert_allclose(strategy.group_models[1], expected, rtol=1e-5, atol=1e-6)
    by_group = {g.group_id: sorted(g.members) for g in second.groups}
    assert by_group[2] == ["c0", "c1"]


def test_the_global_model_averages_only_centres_that_trained() -> None:
    strategy = FeSEM(n_groups=3, clients_per_round=4)
    strategy.setup(clients(), INITIAL, np.random.default_rng(0))
    plan = strategy.plan_round(1, context())
    (group,) = plan.groups
    trained = INITIAL + 1.0
    members = tuple(MemberResult(c, 10, 1.0, trained) for c in group.members)
    strategy.aggregate(1, plan, [GroupResult(group.group_id, members)])
    np.testing.assert_allclose(strategy.global_weights, trained)


def test_the_earlier_order_is_kept_by_name_and_a_wrong_name_is_refused() -> None:
    strategy = make_strategy("fesem", n_groups=2, clients_per_round=2, variant="perturbed")
    strategy.setup(clients(2), INITIAL, np.random.default_rng(0))
    # 1 % perturbations of the start
    assert all(np.abs(c - INITIAL).max() < 0.05 for c in strategy.group_models)
    with pytest.raises(StrategyError, match="variant must be one of public, perturbed"):
        make_strategy("fesem", variant="random")
