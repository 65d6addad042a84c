"""IFCA (Ghosh et al. 2020): model averaging over the clients that chose a cluster."""

from __future__ import annotations

import numpy as np

from server.strategies.base import GroupResult, MemberResult, RoundPlan
from server.strategies.ifca import IFCA
from tests.server.strategies.fakes import info


def test_cluster_model_is_the_plain_mean_of_its_trainers() -> None:
    """Alg. 2 (model averaging): θ_j = Σ_i s_ij θ_i / Σ_i s_ij, unweighted by sample counts."""
    # Prepare: two clients chose cluster 0; one holds three times the other's samples
    strategy = IFCA(n_groups=2, clients_per_round=2)
    strategy.setup([info("a", np.array([10.0])), info("b", np.array([30.0]))], np.ones(2), np.random.default_rng(0))
    untouched = strategy.group_models[1].copy()
    members = (
        MemberResult("a", 10, 1.0, np.array([0.0, 0.0], np.float32)),
        MemberResult("b", 30, 1.0, np.array([4.0, 4.0], np.float32)),
    )

    # Execute
    strategy.aggregate(1, RoundPlan(1, (), {}), [GroupResult(0, members)])

    # Assert: [2, 2], not the sample-weighted [3, 3]; cluster 1 had no trainer
    np.testing.assert_allclose(strategy.group_models[0], [2.0, 2.0])
    np.testing.assert_array_equal(strategy.group_models[1], untouched)
