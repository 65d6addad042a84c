"""Inter-group aggregation of FedGroup / FlexCFL (FedGroup Alg. 2 lines 16-19; FlexCFL
Alg. 2 lines 19-22 and Eq. 20).

Two forms:

* ``"literal"`` (``convex=False``, this function's default): Eq. (20) as printed,
  ``w_j <- w_j + η_g Σ_{l≠j} w_l / ||w_l||``. Every application adds up to
  ``η_g (m - 1)`` to a model's norm, so for η_g > 1 the norms grow without bound:
  ``[1, 0], [0, 1]`` with η_g = 5 become ``[1, 5], [5, 1]``, then about
  ``[5.9, 6.0]``, and so on.
* ``"convex"`` (``convex=True``, what the public FlexCFL code computes):
  ``w_j <- (w_j + Σ_{l≠j} (η_g / ||w_l||) w_l) / (1 + Σ_{l≠j} η_g / ||w_l||)``, a convex
  combination of the group models, so no norm ever exceeds the largest one. The
  paper's η_g = 0.1 and η_g = 5.0 results (FlexCFL Tables 3 and 4) were produced by
  that code, which is why the strategies default to this form
  (``eta_g_form="convex"``).

``η_g = 0`` leaves every group alone (pluralistic) in both forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from server.errors import GroupingError

IntergroupForm = Literal["convex", "literal"]
INTERGROUP_FORMS: tuple[IntergroupForm, ...] = ("convex", "literal")


def intergroup_aggregate(models: Sequence[np.ndarray], eta_g: float, *, convex: bool = False) -> list[np.ndarray]:
    """Every group model after one inter-group aggregation with rate ``eta_g``.

    Parameters
    ----------
    models: the group models after their intra-group FedAvg (``w~`` of Alg. 2).
    eta_g: the inter-group learning rate η_g >= 0.
    convex: ``False``: Eq. (20) literally; ``True``: the normalised (convex) form of the
        public FlexCFL code. See the module docstring.
    """
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
