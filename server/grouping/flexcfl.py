"""FlexCFL client migration (Duan et al., FlexCFL, Sec. 3.4, Alg. 2 lines 5-7, Eq. 9).

Before a round, a warm client whose training label distribution moved too far since
it was grouped is cold-started again (re-assigned by Eq. 8 of FlexCFL, FedGroup's
Eq. 9). Eq. (9) sets the threshold ``τ_i = 0.2 n_i / LabelSize``: "20 % of the
training data changed".

The distance. The public code calls ``scipy.stats.wasserstein_distance(new, old)`` on
the two *count vectors*, treating the counts as samples of a scalar: it matches the
smallest count with the smallest, and so on, and cannot tell apart histograms that
are permutations of each other (all samples relabelled, distance 0). covey pairs the
counts by *label position*: ``d = mean_ℓ |new_ℓ - old_ℓ|``, the same quantity as the
public code's distance when both vectors are matched label by label instead of by
sorted order, so Eq. (9)'s threshold keeps its meaning (d > τ_i iff the counts changed
by more than 0.2 n_i in total). :func:`label_w1` gives the Wasserstein-1 distance
between the normalised label distributions over label positions as well.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import wasserstein_distance

from server.errors import GroupingError


def _pair(old_counts: np.ndarray, new_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    old = np.asarray(old_counts, np.float64)
    new = np.asarray(new_counts, np.float64)
    if old.shape != new.shape or old.ndim != 1:
        raise GroupingError(f"label histograms differ in shape: {old.shape} vs {new.shape}")
    if not (np.isfinite(old).all() and np.isfinite(new).all()) or (old < 0).any() or (new < 0).any():
        raise GroupingError("label histograms must be finite and non-negative")
    return old, new


def label_shift(old_counts: np.ndarray, new_counts: np.ndarray) -> float:
    """Mean absolute per-label count change, labels paired by position."""
    old, new = _pair(old_counts, new_counts)
    return float(np.abs(new - old).mean())


def label_w1(old_counts: np.ndarray, new_counts: np.ndarray) -> float:
    """Wasserstein-1 between the normalised label distributions (ground metric |i - j|)."""
    old, new = _pair(old_counts, new_counts)
    if old.sum() == 0 or new.sum() == 0:
        return 0.0 if old.sum() == new.sum() else float("inf")
    pos = np.arange(len(old), dtype=np.float64)
    return float(wasserstein_distance(pos, pos, u_weights=old, v_weights=new))


def shift_threshold(n_samples: int, n_labels: int, fraction: float = 0.2) -> float:
    """τ_i of Eq. (9): ``fraction * n_i / LabelSize``."""
    if n_labels < 1:
        raise GroupingError("LabelSize must be at least 1")
    return fraction * n_samples / n_labels


def needs_migration(old_counts: np.ndarray, new_counts: np.ndarray, fraction: float = 0.2) -> bool:
    """True when the client's label histogram moved by more than τ_i (Eq. 9)."""
    old, new = _pair(old_counts, new_counts)
    return label_shift(old, new) > shift_threshold(int(old.sum()), len(old), fraction)
