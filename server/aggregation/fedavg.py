"""FedAvg aggregation (McMahan et al. 2017): the sample-weighted mean of client models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.errors import GroupingError

_BLOCK = 1 << 16  # values per cache block of the weighted sum


def weighted_average(models: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
    """``sum_i w_i m_i / sum_i w_i``, accumulated in float64 (McMahan et al. 2017, Alg. 1).

    Cache-blocked: the sum runs over slices of ``_BLOCK`` values, so the float64
    accumulator and product stay in cache and no n x d stack or full-length float64
    temporary is made, where whole-vector ``acc += w * m`` sends a model-length float64
    temporary and the accumulator through memory for every model. On the server this
    sits at the end of every round, after the last device reported.
    """
    if len(models) == 0:
        raise GroupingError("cannot average zero models")
    w = np.ones(len(models)) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (len(models),):
        raise GroupingError(f"{len(models)} models but {w.shape} weights")
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise GroupingError("aggregation weights must be finite, non-negative and not all zero")
    arrays = [np.asarray(m) for m in models]
    shape = arrays[0].shape
    for m in arrays:
        if m.shape != shape:
            raise GroupingError(f"models differ in shape: {m.shape} vs {shape}")
    used = [(m.reshape(-1), wi) for m, wi in zip(arrays, w, strict=True) if wi]
    size = int(np.prod(shape, dtype=np.int64))
    out = np.empty(size, np.float32)
    acc, product = np.empty(min(_BLOCK, size)), np.empty(min(_BLOCK, size))
    total = w.sum()
    for start in range(0, size, _BLOCK):
        stop = min(size, start + _BLOCK)
        a, p = acc[: stop - start], product[: stop - start]
        a.fill(0.0)
        for flat, wi in used:
            # float32 -> float64 exactly, then the product in float64, in place: numpy 2's
            # np.multiply(flat, wi, out=p) gives the same values through a slower casting
            # loop; numpy 1.x's rounded the product to float32 (a numpy scalar weight did
            # not promote the loop to float64)
            np.copyto(p, flat[start:stop])
            p *= wi
            a += p
        np.divide(a, total, out=out[start:stop], casting="same_kind")
    return out.reshape(shape)
