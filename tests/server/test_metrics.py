"""CPD (FedGSP Eq. 14): MMD² with a Gaussian RBF kernel over class distributions."""

from __future__ import annotations

import numpy as np
import pytest

from server.metrics import cpd, group_global_divergence, onehot_rbf_kernel, pairwise_cpd


def test_cpd_equals_the_mmd_expectation_formula() -> None:
    p_counts, q_counts = np.array([3.0, 1.0, 0.0]), np.array([1.0, 1.0, 2.0])
    p, q = p_counts / 4, q_counts / 4
    k = onehot_rbf_kernel(3, sigma=1.0)

    # E_{x,x'~P} K - 2 E_{x~P,y~Q} K + E_{y,y'~Q} K, written as sums over classes
    expected = sum(
        p[i] * p[j] * k[i, j] - 2 * p[i] * q[j] * k[i, j] + q[i] * q[j] * k[i, j] for i in range(3) for j in range(3)
    )

    assert cpd(p_counts, q_counts) == pytest.approx(expected)
    assert cpd(p_counts, q_counts) == pytest.approx((1 - np.exp(-1)) * ((p - q) ** 2).sum())
    assert cpd(p_counts, 2 * p_counts) == pytest.approx(0.0)


def test_pairwise_cpd_and_divergence() -> None:
    counts = np.array([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    vals = pairwise_cpd(counts, [np.array([0]), np.array([1]), np.array([2])])
    assert len(vals) == 3
    assert vals[0] == pytest.approx(cpd(counts[0], counts[1]))
    div = group_global_divergence(np.array([[1.0, 0.0], [-1.0, 0.0]]), np.array([1.0, 1.0]))
    np.testing.assert_allclose(div, [1.0, 1.0])
