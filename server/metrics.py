"""Group-quality metrics: CPD (FedGSP Eq. 14) and group-to-global divergence.

CPD(m1, m2) = MMD²(P, Q) between two groups' normalised class distributions with a
Gaussian RBF kernel. Classes are points of the label space embedded one-hot, so the
kernel is ``K(i, j) = 1`` if ``i == j`` else ``exp(-1 / σ²)`` (‖e_i - e_j‖² = 2, over
2σ²), and MMD² = (P - Q)ᵀ K (P - Q) = (1 - exp(-1/σ²)) ‖P - Q‖². A custom class-to-class
kernel matrix can be given instead (e.g. for ordered labels).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from server.errors import GroupingError
from server.grouping._checks import check_counts


def normalise(counts: np.ndarray) -> np.ndarray:
    """Rows of class counts as probability distributions (an all-zero row stays zero)."""
    counts = np.asarray(counts, np.float64)
    totals = counts.sum(-1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def onehot_rbf_kernel(n_classes: int, sigma: float = 1.0) -> np.ndarray:
    off = np.exp(-1.0 / sigma**2)
    return np.full((n_classes, n_classes), off) + (1.0 - off) * np.eye(n_classes)


def cpd(p_counts: np.ndarray, q_counts: np.ndarray, kernel: np.ndarray | None = None, sigma: float = 1.0) -> float:
    """CPD between two groups given their summed class counts (FedGSP Eq. 14)."""
    p, q = normalise(np.asarray(p_counts)), normalise(np.asarray(q_counts))
    if p.shape != q.shape or p.ndim != 1:
        raise GroupingError(f"class-count vectors differ in shape: {p.shape} vs {q.shape}")
    k = onehot_rbf_kernel(len(p), sigma) if kernel is None else kernel
    diff = p - q
    return float(diff @ k @ diff)


def group_class_counts(counts: np.ndarray, groups: Sequence[np.ndarray]) -> np.ndarray:
    counts = check_counts(counts)
    return np.array([counts[np.asarray(g, int)].sum(0) for g in groups])


def pairwise_cpd(counts: np.ndarray, groups: Sequence[np.ndarray], sigma: float = 1.0) -> np.ndarray:
    """CPD of every pair of groups (upper triangle, flattened)."""
    if len(groups) < 2:
        return np.zeros(0)
    dist = normalise(group_class_counts(counts, groups))
    factor = 1.0 - np.exp(-1.0 / sigma**2)
    sq = ((dist[:, None, :] - dist[None, :, :]) ** 2).sum(-1)
    iu = np.triu_indices(len(groups), 1)
    return factor * sq[iu]


def group_global_divergence(
    group_vectors: np.ndarray, group_weights: np.ndarray, global_vector: np.ndarray | None = None
) -> np.ndarray:
    """‖g_k - g‖ per group (FedAvg-IC Eq. 7): the distance of each group's gradient or
    update from the (sample-weighted) global one."""
    vectors = np.asarray(group_vectors, np.float64)
    w = np.asarray(group_weights, np.float64)
    g = (w @ vectors) / w.sum() if global_vector is None else np.asarray(global_vector, np.float64)
    return np.linalg.norm(vectors - g, axis=1)


def median_group_cpd(groups: Sequence[Sequence[str]], counts: Mapping[str, np.ndarray]) -> float:
    """The median CPD over every pair of ``groups`` (client ids) of each client's class
    ``counts`` (how differently the groups are distributed; 0 for fewer than two)."""
    if len(groups) < 2:
        return 0.0
    index = {c: i for i, c in enumerate(counts)}
    table = np.array(list(counts.values()), np.float64)
    members = [np.array([index[c] for c in g if c in index]) for g in groups]
    return float(np.median(pairwise_cpd(table, members)))
