"""Inter-group aggregation of FedGroup / FlexCFL (FedGroup Alg. 2 lines 16-19).

Paper form (default): ``w_j <- w_j + η_g * sum_{l != j} w_l / ||w_l||``.
Convex form (``convex=True``, what the public FlexCFL code computes):
``w_j <- (w_j + sum_{l != j} (η_g / ||w_l||) w_l) / (1 + sum_{l != j} η_g / ||w_l||)``,
which keeps the models' scale. ``η_g = 0`` leaves every group alone (pluralistic).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.errors import GroupingError


def intergroup_aggregate(models: Sequence[np.ndarray], eta_g: float, *, convex: bool = False) -> list[np.ndarray]:
    if eta_g < 0 or not np.isfinite(eta_g):
        raise GroupingError(f"η_g must be a non-negative number, got {eta_g}")
    if eta_g == 0 or len(models) < 2:
        return [np.asarray(m, np.float32).copy() for m in models]
    stack = [np.asarray(m, np.float64) for m in models]
    norms = np.array([np.linalg.norm(m) for m in stack])
    if (norms == 0).any():
        raise GroupingError("a group model is all zeros; inter-group aggregation needs non-zero models")
    coef = eta_g / norms
    total = sum(c * m for c, m in zip(coef, stack, strict=True))
    out = []
    for j, m in enumerate(stack):
        others = total - coef[j] * m
        if convex:
            out.append(((m + others) / (1 + coef.sum() - coef[j])).astype(np.float32))
        else:
            out.append((m + others).astype(np.float32))
    return out
