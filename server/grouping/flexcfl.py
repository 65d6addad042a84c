"""FlexCFL client migration (Duan et al., FlexCFL, Sec. 3.4, Alg. 2 lines 4-7, Eq. 9).

Before a round, a warm client whose training label distribution moved too far since
it was grouped is cold-started again (re-assigned by Eq. 8 of FlexCFL, FedGroup's
Eq. 9). Eq. (9) sets the threshold ``τ_i = 0.2 n_i / LabelSize`` and reads it as
"20 % training data change will be considered as distribution shift".

The distance. The public code calls ``scipy.stats.wasserstein_distance(new, old)`` on
the two *count vectors*, treating the counts as samples of a scalar: it matches the
smallest count with the smallest, and so on, and cannot tell apart histograms that
are permutations of each other (all samples relabelled, distance 0). covey pairs the
counts by *label position* and measures how many samples changed, per label::

    d = max(Σ_ℓ max(new_ℓ - old_ℓ, 0), Σ_ℓ max(old_ℓ - new_ℓ, 0)) / LabelSize

Relabelling ``m`` samples raises some counts by ``m`` in total and lowers others by
``m``, so ``d = m / LabelSize``; adding ``a`` samples gives ``a / LabelSize``; removing
``r`` gives ``r / LabelSize``. Hence ``d > τ_i`` exactly when more than ``0.2 n_i``
samples changed, Eq. (9)'s 20 %. (The mean absolute count change,
``mean_ℓ |new_ℓ - old_ℓ|``, counts a relabelled sample twice, once where it left and
once where it arrived, and so fired at 10 %.) :func:`label_w1` gives the
Wasserstein-1 distance between the normalised label distributions over label
positions as well.
"""

from __future__ import annotations

import numpy as np

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
    """Samples changed per label, labels paired by position (see the module docstring).

    ``max(total increase, total decrease) / LabelSize``: ``m / LabelSize`` for ``m``
    relabelled samples, ``a / LabelSize`` for ``a`` added ones, so that Eq. (9)'s
    ``τ_i = 0.2 n_i / LabelSize`` fires when more than 20 % of the data changed.
    """
    old, new = _pair(old_counts, new_counts)
    diff = new - old
    changed = max(float(diff[diff > 0].sum()), float(-diff[diff < 0].sum()))
    return changed / len(old)


def label_w1(old_counts: np.ndarray, new_counts: np.ndarray) -> float:
    """Wasserstein-1 between the normalised label distributions (ground metric |i - j|)."""
    old, new = _pair(old_counts, new_counts)
    if old.sum() == 0 or new.sum() == 0:
        return 0.0 if old.sum() == new.sum() else float("inf")
    from scipy.stats import wasserstein_distance  # here: scipy.stats is slow to import

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
