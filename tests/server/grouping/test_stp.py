"""STP schedule (FedGSP Alg. 1, Eq. 1-3) and chain aggregation."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import GroupingError
from server.grouping.stp import STPSchedule, aggregate_chains, group_count


def test_growth_functions_follow_equations_1_to_3() -> None:
    # linear: β floor(α (r-1) + 1); log: β floor(α ln r + 1); exp: β floor((1+α)^(r-1))
    assert [group_count(r, "linear", 0.5, 2) for r in (1, 2, 3, 4)] == [2, 2, 4, 4]
    assert [group_count(r, "log", 2.0, 10) for r in (1, 2, 3, 10)] == [10, 20, 30, 50]
    assert [group_count(r, "exp", 1.0, 3) for r in (1, 2, 3, 4)] == [3, 6, 12, 24]


def test_group_count_is_capped_by_the_clients_and_sampling_follows_kappa() -> None:
    sched = STPSchedule("log", 2.0, 10, kappa=0.3)
    assert sched.n_groups(100, 51) == 51
    picked = sched.sample_groups(20, random_state=0)
    assert len(picked) == 6 and len(set(picked.tolist())) == 6
    assert len(sched.sample_groups(1, random_state=0)) == 1


def test_aggregation_averages_only_the_chains_that_trained() -> None:
    a, b = np.array([1.0, 2.0]), np.array([3.0, 6.0])

    weighted = aggregate_chains([a, b], [100, 300])
    plain = aggregate_chains([a, b], [100, 300], weighted=False)

    np.testing.assert_allclose(weighted, [2.5, 5.0])
    np.testing.assert_allclose(plain, [2.0, 4.0])  # not the paper's (a+b)/f(r)


def test_aggregating_identical_models_returns_that_model() -> None:
    m = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    np.testing.assert_array_equal(aggregate_chains([m, m, m], [1, 5, 9]), m)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: group_count(0), "from 1"),
        (lambda: group_count(1, "cubic"), "unknown growth"),
        (lambda: STPSchedule(kappa=0.0), "κ"),
        (lambda: STPSchedule(beta=0), "β"),
        (lambda: aggregate_chains([], []), "no group trained"),
    ],
)
def test_bad_schedule_settings_are_refused(call, message: str) -> None:
    with pytest.raises(GroupingError, match=message):
        call()
