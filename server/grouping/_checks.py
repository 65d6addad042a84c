"""Input validation shared by the grouping algorithms: clear errors naming the problem."""

from __future__ import annotations

import numbers

import numpy as np

from server.errors import GroupingError

RandomState = int | np.random.Generator | None


def as_generator(random_state: RandomState) -> np.random.Generator:
    """The one ``np.random.Generator`` an algorithm draws from."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or isinstance(random_state, numbers.Integral):
        return np.random.default_rng(random_state)
    raise GroupingError(f"random_state must be None, an int or a numpy Generator, got {type(random_state).__name__}")


def check_matrix(x: object, name: str, *, min_rows: int = 1) -> np.ndarray:
    """A finite 2-D float array with at least ``min_rows`` rows."""
    arr = np.asarray(x, dtype=np.float64) if not isinstance(x, np.ndarray) else x
    if arr.ndim != 2:
        raise GroupingError(f"{name} must be a 2-D array (clients x features), got shape {arr.shape}")
    if arr.shape[0] < min_rows:
        if arr.shape[0] == 0:
            raise GroupingError(f"{name} is empty: no clients to group")
        raise GroupingError(f"{name} has {arr.shape[0]} rows; at least {min_rows} are needed")
    if not np.issubdtype(arr.dtype, np.number):
        raise GroupingError(f"{name} must be numeric, got dtype {arr.dtype}")
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise GroupingError(f"{name} holds NaN or infinite values (first at row {bad[0]}, column {bad[1]})")
    return arr


def check_counts(counts: object, name: str = "class counts") -> np.ndarray:
    """Class-count vectors V^k: a finite, non-negative clients x classes matrix."""
    arr = check_matrix(counts, name)
    if (arr < 0).any():
        row = int(np.argwhere(arr < 0)[0][0])
        raise GroupingError(f"{name} must be non-negative; row {row} has a negative count")
    return arr.astype(np.float64, copy=False)


def check_square(matrix: object, name: str, *, symmetric: bool = True, non_negative: bool = False) -> np.ndarray:
    """A finite square matrix, optionally symmetric and non-negative."""
    arr = check_matrix(matrix, name)
    if arr.shape[0] != arr.shape[1]:
        raise GroupingError(f"{name} must be square, got shape {arr.shape}")
    if symmetric and not np.allclose(arr, arr.T, rtol=1e-6, atol=1e-9):
        i, j = np.unravel_index(int(np.argmax(np.abs(arr - arr.T))), arr.shape)
        raise GroupingError(f"{name} must be symmetric; entry ({i}, {j}) = {arr[i, j]} but ({j}, {i}) = {arr[j, i]}")
    if non_negative and (arr < 0).any():
        raise GroupingError(f"{name} must be non-negative")
    return arr.astype(np.float64, copy=False)


def check_n_groups(n_groups: object, n_clients: int, name: str = "n_groups") -> int:
    if not isinstance(n_groups, numbers.Integral) or isinstance(n_groups, bool):
        raise GroupingError(f"{name} must be an integer, got {n_groups!r}")
    n_groups = int(n_groups)
    if n_groups < 1:
        raise GroupingError(f"{name} must be at least 1, got {n_groups}")
    if n_groups > n_clients:
        raise GroupingError(f"{name} = {n_groups} is more than the {n_clients} clients to group")
    return int(n_groups)


def check_fraction(value: object, name: str, *, allow_zero: bool = False) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not np.isfinite(float(value)):
        raise GroupingError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not ((v >= 0 if allow_zero else v > 0) and v <= 1):
        raise GroupingError(f"{name} must be in {'[0' if allow_zero else '(0'}, 1], got {v}")
    return v
