"""Byzantine-robust aggregation: coordinate-wise median and trimmed mean.

Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates", ICML 2018:

* coordinate-wise median (their Option I): ``g_j = med{x_1j, ..., x_mj}`` for every
  coordinate ``j``;
* coordinate-wise β-trimmed mean (Option II, Definition 2): for every coordinate,
  drop the ``⌊β m⌋`` largest and the ``⌊β m⌋`` smallest of the ``m`` values and
  average the rest; it tolerates up to ``⌊β m⌋`` Byzantine inputs, so ``β`` must
  stay below 1/2.

Both are unweighted, as in the paper: a sample count is what a Byzantine device would
lie about first. ``rule="mean"`` is FedAvg's sample-weighted mean (McMahan et al.
2017). The work runs over blocks of coordinates, so no ``m x d`` float64 copy of the
models is ever made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from server.aggregation.fedavg import weighted_average
from server.errors import GroupingError

AggregationRule = Literal["mean", "median", "trimmed_mean"]
AGGREGATIONS: tuple[AggregationRule, ...] = ("mean", "median", "trimmed_mean")
_BLOCK = 1 << 15  # coordinates per block


def _stack_blocks(models: Sequence[np.ndarray]) -> tuple[list[np.ndarray], tuple[int, ...], int]:
    if len(models) == 0:
        raise GroupingError("cannot aggregate zero models")
    arrays = [np.asarray(m, np.float32) for m in models]
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays):
        raise GroupingError(f"models differ in shape: {sorted({a.shape for a in arrays})}")
    return [a.reshape(-1) for a in arrays], shape, int(np.prod(shape, dtype=np.int64))


def coordinate_median(models: Sequence[np.ndarray]) -> np.ndarray:
    """The coordinate-wise median of ``models`` (Yin et al. 2018, Option I)."""
    flat, shape, size = _stack_blocks(models)
    out = np.empty(size, np.float32)
    for start in range(0, size, _BLOCK):
        stop = min(size, start + _BLOCK)
        block = np.stack([f[start:stop] for f in flat])
        out[start:stop] = np.median(block, axis=0)
    return out.reshape(shape)


def trimmed_count(m: int, trim: float) -> int:
    """``⌊β m⌋``: values dropped at each end of every coordinate."""
    return int(np.floor(trim * m + 1e-9))


def trimmed_mean(models: Sequence[np.ndarray], trim: float) -> np.ndarray:
    """The coordinate-wise ``trim``-trimmed mean (Yin et al. 2018, Option II, Def. 2).

    Parameters
    ----------
    models : the m models (same shape).
    trim : β in [0, 1/2): the fraction dropped at each end of every coordinate.
    """
    if not 0 <= trim < 0.5:
        raise GroupingError(f"the trimmed fraction must be in [0, 0.5), got {trim}")
    flat, shape, size = _stack_blocks(models)
    b = trimmed_count(len(flat), trim)
    out = np.empty(size, np.float32)
    for start in range(0, size, _BLOCK):
        stop = min(size, start + _BLOCK)
        block = np.stack([f[start:stop] for f in flat])
        if b:
            block = np.partition(block, (b, len(flat) - b - 1), axis=0)[b : len(flat) - b]
        out[start:stop] = block.mean(axis=0, dtype=np.float64)
    return out.reshape(shape)


def combine(
    models: Sequence[np.ndarray],
    weights: Sequence[float] | None = None,
    *,
    rule: AggregationRule = "mean",
    trim: float = 0.2,
) -> np.ndarray:
    """Aggregate ``models`` by ``rule``: the (``weights``-weighted) mean, the
    coordinate-wise median, or the ``trim``-trimmed mean (``weights`` ignored)."""
    if rule == "mean":
        return weighted_average(models, weights)
    if rule == "median":
        return coordinate_median(models)
    if rule == "trimmed_mean":
        return trimmed_mean(models, trim)
    raise GroupingError(f"unknown aggregation {rule!r}; choose one of {', '.join(AGGREGATIONS)}")
