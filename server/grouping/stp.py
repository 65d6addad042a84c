"""STP: the Sequential-to-Parallel schedule of FedGSP (Zeng et al. 2022, Sec. 3.1, Alg. 1).

In round r the clients form f(r) groups (by ICG); a fraction κ of the groups is
sampled; inside a group the clients train one after another (a chain, in a freshly
shuffled order), the groups run in parallel, and the server averages the chains'
final models. f grows with r, so training moves from sequential to parallel.

Group-count growth functions (α real, β integer):

* linear, Eq. (1): ``f(r) = β * floor(α (r - 1) + 1)``
* log, Eq. (2): ``f(r) = β * floor(α ln r + 1)``
* exp, Eq. (3): ``f(r) = β * floor((1 + α)^(r - 1))``

Aggregation (Alg. 1 line 14) divides the *sum of the κ·f(r) sampled* group models by
f(r), which shrinks the model whenever κ < 1. covey averages over the groups that
actually trained instead: weighted by their samples by default, unweighted as an
option (:func:`aggregate_chains`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from server.errors import GroupingError
from server.grouping._checks import RandomState, as_generator, check_fraction

GROWTH_FUNCTIONS = ("linear", "log", "exp")


def group_count(r: int, growth: str = "log", alpha: float = 2.0, beta: int = 10) -> int:
    """f(r), the number of groups in round ``r`` (r >= 1), FedGSP Eq. (1)-(3)."""
    if r < 1:
        raise GroupingError(f"rounds count from 1, got r = {r}")
    if not (isinstance(beta, (int, np.integer)) and beta >= 1):
        raise GroupingError(f"β must be a positive integer, got {beta!r}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise GroupingError(f"α must be a non-negative number, got {alpha!r}")
    if growth == "linear":
        value = beta * math.floor(alpha * (r - 1) + 1)
    elif growth == "log":
        value = beta * math.floor(alpha * math.log(r) + 1)
    elif growth == "exp":
        try:
            value = beta * math.floor((1.0 + alpha) ** (r - 1))
        except OverflowError:
            value = 2**62
    else:
        raise GroupingError(f"unknown growth function {growth!r}; choose one of {', '.join(GROWTH_FUNCTIONS)}")
    return max(1, int(min(value, 2**62)))


@dataclass(frozen=True)
class STPSchedule:
    """The STP plan parameters: growth function, α, β and the group sampling rate κ."""

    growth: str = "log"
    alpha: float = 2.0
    beta: int = 10
    kappa: float = 0.3

    def __post_init__(self) -> None:
        group_count(1, self.growth, self.alpha, self.beta)  # validates
        check_fraction(self.kappa, "kappa (κ, the group sampling rate)")

    def n_groups(self, r: int, n_clients: int) -> int:
        """f(r), capped at the number of clients."""
        return min(group_count(r, self.growth, self.alpha, self.beta), n_clients)

    def sample_groups(self, n_groups: int, random_state: RandomState = None) -> np.ndarray:
        """Indices of the ``max(1, round(κ n))`` groups that train this round (Alg. 1 line 5)."""
        rng = as_generator(random_state)
        n_sampled = max(1, round(self.kappa * n_groups))
        return np.sort(rng.choice(n_groups, size=n_sampled, replace=False))


def aggregate_chains(models: Sequence[np.ndarray], n_samples: Sequence[float], *, weighted: bool = True) -> np.ndarray:
    """Mean of the chain models of the groups that trained (replaces Alg. 1 line 14).

    Weighted by each chain's total samples by default; ``weighted=False`` gives the
    plain mean. Identical models aggregate to that model exactly up to rounding.
    """
    if len(models) == 0:
        raise GroupingError("no group trained this round: nothing to aggregate")
    if len(models) != len(n_samples):
        raise GroupingError(f"{len(models)} models but {len(n_samples)} sample counts")
    stack = np.stack([np.asarray(m, np.float64) for m in models])
    w = np.asarray(n_samples, np.float64) if weighted else np.ones(len(models))
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise GroupingError("sample counts must be non-negative and not all zero")
    return (w @ stack / w.sum()).astype(np.float32)
