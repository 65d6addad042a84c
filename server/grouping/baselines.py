"""Baseline groupings the papers compare against.

* NaiveGSP / Astraea-style random groups (FedGSP Sec. 4.1): a random partition into
  groups of (almost) equal size, trained as sequential chains.
* IFCA (Ghosh et al. 2020): each client joins the group model with the lowest loss on
  its own training data.
* FeSEM (Xie et al. 2020, "multi-center FL"): ℓ2 stochastic EM — each client joins the
  nearest centre in parameter space; a centre is the mean of its members' models.
* HierFAVG (Liu et al. 2020): groups by network edge (clients behind the same edge
  server), or, without edge ids, by k-medoids on the measured RTT matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.errors import GroupingError
from server.grouping._checks import RandomState, as_generator, check_matrix, check_n_groups
from server.grouping.kmedoids import kmedoids


def random_groups(n_clients: int, n_groups: int, random_state: RandomState = None) -> list[np.ndarray]:
    """A random partition of ``range(n_clients)`` into ``n_groups`` sizes differing by <= 1."""
    if n_clients < 1:
        raise GroupingError("no clients to group")
    k = check_n_groups(n_groups, n_clients)
    rng = as_generator(random_state)
    return [np.asarray(g) for g in np.array_split(rng.permutation(n_clients), k)]


def ifca_assign(losses: np.ndarray) -> np.ndarray:
    """Group of every client: argmin over a clients x groups loss matrix."""
    mat = check_matrix(np.asarray(losses, np.float64), "loss matrix")
    return np.argmin(mat, axis=1).astype(np.int64)


def fesem_assign(models: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """E-step of FeSEM: nearest centre by ℓ2 distance (computed without n x m x d arrays)."""
    x = np.asarray(models)
    c = np.asarray(centres)
    if x.ndim != 2 or c.ndim != 2 or x.shape[1] != c.shape[1]:
        raise GroupingError(f"models {x.shape} and centres {c.shape} must be 2-D with the same width")
    xx = np.einsum("ij,ij->i", x, x, dtype=np.float64)
    cc = np.einsum("ij,ij->i", c, c, dtype=np.float64)
    d = xx[:, None] + cc[None, :] - 2.0 * (x @ c.T).astype(np.float64)
    if not np.isfinite(d).all():
        raise GroupingError("models or centres hold NaN or infinite values")
    return np.argmin(d, axis=1).astype(np.int64)


def fesem_centres(models: np.ndarray, labels: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """M-step of FeSEM: each centre is the mean of its members (unchanged if empty)."""
    out = np.array(previous, np.float32, copy=True)
    for g in range(len(out)):
        members = labels == g
        if members.any():
            out[g] = np.asarray(models)[members].mean(0)
    return out


def groups_by_edge(edge_ids: Sequence[object]) -> list[np.ndarray]:
    """HierFAVG: one group per edge id, clients in order of appearance."""
    if len(edge_ids) == 0:
        raise GroupingError("no clients to group")
    order: dict[object, list[int]] = {}
    for i, e in enumerate(edge_ids):
        order.setdefault(e, []).append(i)
    return [np.array(v) for v in order.values()]


def groups_by_rtt(rtt: np.ndarray, n_groups: int, random_state: RandomState = None) -> list[np.ndarray]:
    """HierFAVG without edge ids: k-medoids on the RTT matrix (clients near each other)."""
    labels, _, _ = kmedoids(rtt, n_groups, random_state=random_state)
    return [np.flatnonzero(labels == g) for g in range(n_groups) if (labels == g).any()]
