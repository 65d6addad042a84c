"""FedAvg aggregation (McMahan et al. 2017): the sample-weighted mean of client models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.errors import GroupingError


def weighted_average(models: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
    """``sum_i w_i m_i / sum_i w_i``, accumulated in float64 one model at a time (no
    n x d stack, so 50 copies of a 6.6 M-parameter CNN need one extra vector)."""
    if len(models) == 0:
        raise GroupingError("cannot average zero models")
    w = np.ones(len(models)) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (len(models),):
        raise GroupingError(f"{len(models)} models but {w.shape} weights")
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise GroupingError("aggregation weights must be finite, non-negative and not all zero")
    shape = np.shape(models[0])
    acc = np.zeros(shape, np.float64)
    for m, wi in zip(models, w, strict=True):
        m = np.asarray(m)
        if m.shape != shape:
            raise GroupingError(f"models differ in shape: {m.shape} vs {shape}")
        if wi:
            acc += wi * m
    return (acc / w.sum()).astype(np.float32)
