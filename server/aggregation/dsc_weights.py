"""DSC aggregation weights (Sun et al., "Dual-segment clustering", Eq. 2-4).

Intra-group, Eq. (4): ``G_k = |D_k| e^{f(θ_k)} / sum_i |D_i| e^{f(θ_i)}`` with
``f(θ) = 1 - exp(-exp(-(θ - 1)))`` and ``θ_k`` the angle between client k's gradient
and the group gradient. The group gradient itself is what Eq. (2) aggregates, so it
is taken as the sample-weighted mean of the members' gradients (as in FedAdp, the
letter's reference [15]). Inter-group, Eq. (3): ``G_l = |D_l| / sum_l |D_l|``.
"""

from __future__ import annotations

import numpy as np

from server.errors import GroupingError


def angle_weights(gradients: np.ndarray, n_samples: np.ndarray) -> np.ndarray:
    """Eq. (4) weights for the members of one group (rows of ``gradients``)."""
    g = np.asarray(gradients, np.float64)
    n = np.asarray(n_samples, np.float64)
    if g.ndim != 2 or len(g) != len(n) or len(g) == 0:
        raise GroupingError("need one gradient row and one sample count per member")
    if (n <= 0).any():
        raise GroupingError("every member needs a positive sample count")
    group = n @ g / n.sum()
    norms = np.linalg.norm(g, axis=1) * np.linalg.norm(group)
    cos = np.divide(g @ group, norms, out=np.ones(len(g)), where=norms > 0)
    theta = np.arccos(np.clip(cos, -1.0, 1.0))
    f = 1.0 - np.exp(-np.exp(-(theta - 1.0)))
    w = n * np.exp(f)
    return w / w.sum()


def size_weights(group_sizes: np.ndarray) -> np.ndarray:
    """Eq. (3) inter-group weights ``|D_l| / sum |D_l|``."""
    s = np.asarray(group_sizes, np.float64)
    if (s < 0).any() or s.sum() <= 0:
        raise GroupingError("group data sizes must be non-negative and not all zero")
    return s / s.sum()
