"""FedAvg-IC node grouping (Lee et al., "IID and communication-aware group FL",
Sec. 5, Alg. 1 NODE_GROUPING, Eq. 10-12).

k-medoids whose costs combine data and network:

* assign cost, Eq. (10): IID part ``Δ^k`` (Eq. 7) — the distance between group k's
  gradient *with node i in it* and the global gradient — plus communication part
  ``dist(i, medoid_k)`` (hop count or measured RTT);
* update cost, Eq. (11): IID part ``(|D_i|/|D|) ||∇F_i - ∇F||`` plus communication part
  ``sum_{j in group} dist(i, j)``;
* combined, Eq. (12): ``α_iid COST_iid / C_iid + α_comm COST_comm / C_comm``, each part
  normalised by its first value in the optimisation (footnote 2; covey uses the mean of
  the first cost matrix, so the normaliser is positive and scale-free).

Every gradient norm is a quadratic form in the n x n Gram matrix of the clients'
gradients, so no n x d array beyond the gradients themselves is built; the gradients
may be approximated by local updates (``-Δw / (η τ1)``).

How nodes are (re)assigned (:data:`ICAssignment`, named in a run's settings):

* ``"paper"``: Alg. 1 as written: a random membership (line 1) and random medoids
  (line 17), every node moved at once to its argmin of COST_A against the current
  memberships (lines 18 and 21), the medoids updated between (line 20), until the
  assignment is steady or ``max_iter`` steps passed. The IID cost counts the node in the
  group it would join, which favours the largest group: on 30 non-IID clients this
  collapses into one big group and singletons for most seeds (issue 29), the paper's
  objective as much as any implementation;
* ``"descent"``: the same costs, but nodes move one at a time in random order against
  the current memberships (the aggregates updated in O(n) per move), starting from the
  nearest medoid: a descent that settles where the simultaneous moves oscillate, and
  collapses as readily;
* ``"balanced"``: covey's variant that does not collapse. The paper's order and costs,
  but each reassignment is a minimum-cost assignment (``scipy.optimize.
  linear_sum_assignment``) in which every group holds ``floor(n / K)`` or
  ``ceil(n / K)`` nodes, each medoid kept in its group; the random start is balanced
  too. Groups are then within one node of equal size, and the costs choose who goes
  where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

from server.errors import GroupingError
from server.grouping._checks import RandomState, as_generator, check_n_groups, check_square
from server.grouping.fedgroup import gram_matrix


def _iid_assign_cost(gram: np.ndarray, n: np.ndarray, labels: np.ndarray, n_groups: int) -> np.ndarray:
    """Δ^k with node i placed in group k, for all i, k (n x K): Eq. (7) and (10)."""
    total = n.sum()
    b = n / total
    gb = gram @ b
    bgb = b @ gb
    member = labels[:, None] == np.arange(n_groups)[None, :]  # n x K
    a = member * n[:, None]  # column k: sample-weighted indicator of group k
    ga = gram @ a  # n x K
    aga = (a * ga).sum(0)  # K
    agb = a.T @ gb  # K
    nk = a.sum(0)  # K
    diag = np.diag(gram)
    # node i not yet in group k: a_k + n_i e_i over (n_k + n_i)
    denom = nk[None, :] + n[:, None]
    quad = aga[None, :] + 2 * n[:, None] * ga + (n**2 * diag)[:, None]
    cross = agb[None, :] + n[:, None] * gb[:, None]
    with_i = quad / denom**2 - 2 * cross / denom + bgb
    # node i already in group k: Δ^k itself
    nk_safe = np.where(nk > 0, nk, 1.0)
    own = aga / nk_safe**2 - 2 * agb / nk_safe + bgb
    cost = np.where(member, own[None, :], with_i)
    return np.sqrt(np.maximum(cost, 0.0))


def _iid_update_cost(gram: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(|D_i|/|D|) ||∇F_i - ∇F|| for every node (Eq. 11)."""
    b = n / n.sum()
    gb = gram @ b
    sq = np.diag(gram) - 2 * gb + b @ gb
    return b * np.sqrt(np.maximum(sq, 0.0))


class _Memberships:
    """Group aggregates in Gram space, updated in O(n) when one node moves."""

    def __init__(self, gram: np.ndarray, n: np.ndarray, labels: np.ndarray, k: int) -> None:
        self.gram, self.n, self.labels = gram, n, labels.astype(np.int64).copy()
        b = n / n.sum()
        self.gb = gram @ b
        self.bgb = float(b @ self.gb)
        a = (self.labels[:, None] == np.arange(k)[None, :]) * n[:, None]
        self.ga = gram @ a  # n x K
        self.aga = (a * self.ga).sum(0)
        self.agb = a.T @ self.gb
        self.nk = a.sum(0)

    def iid_row(self, i: int) -> np.ndarray:
        """Δ^k for node i in each group k (Eq. 7/10)."""
        ni, own = self.n[i], self.labels[i]
        denom = self.nk + ni
        quad = self.aga + 2 * ni * self.ga[i] + ni * ni * self.gram[i, i]
        cross = self.agb + ni * self.gb[i]
        row = quad / denom**2 - 2 * cross / denom + self.bgb
        nk = self.nk[own]
        row[own] = self.aga[own] / nk**2 - 2 * self.agb[own] / nk + self.bgb
        return np.sqrt(np.maximum(row, 0.0))

    def move(self, i: int, to: int) -> None:
        frm, ni, col = self.labels[i], self.n[i], self.gram[:, i]
        for g, sign in ((frm, -1.0), (to, 1.0)):
            # a_g changes by sign * n_i e_i
            self.aga[g] += sign * 2 * ni * self.ga[i, g] + ni * ni * self.gram[i, i]
            self.ga[:, g] += sign * ni * col
            self.agb[g] += sign * ni * self.gb[i]
            self.nk[g] += sign * ni
        self.labels[i] = to


ICAssignment = Literal["paper", "descent", "balanced"]
MUST_FILL = 1e6  # the bonus of a balanced assignment's required slots (costs are normalised, O(1))
ASSIGNMENTS: tuple[ICAssignment, ...] = ("paper", "descent", "balanced")


@dataclass(frozen=True)
class ICResult:
    labels: np.ndarray
    medoids: np.ndarray
    n_iter: int
    cost: float


def fedavg_ic_groups(
    gradients: np.ndarray,
    n_samples: np.ndarray,
    distance: np.ndarray,
    n_groups: int,
    *,
    alpha_iid: float = 1.0,
    alpha_comm: float = 1.0,
    max_iter: int = 50,
    random_state: RandomState = None,
    gram: np.ndarray | None = None,
    assignment: ICAssignment = "descent",
    restarts: int = 1,
) -> ICResult:
    """NODE_GROUPING of FedAvg-IC Alg. 1 (lines 16-22).

    Parameters
    ----------
    gradients: one (approximate) local gradient per node, nodes x parameters.
    n_samples: |D_i| per node.
    distance: symmetric non-negative node-to-node distance (hops or RTT).
    n_groups: |K|.
    alpha_iid, alpha_comm: weights of Eq. (12).
    max_iter: the most iterations of lines 19-21 (medoid update, reassignment): the
        paper's "maximum steady steps". The paper's experiments use 1 (Sec. 6.1), which
        is the :class:`~server.strategies.fedavg_ic.FedAvgIC` default; direct callers get
        50, enough to reach a steady cost.
    random_state: seed or generator for the medoids and the reassignment order.
    gram: optional precomputed Gram matrix of ``gradients``.
    assignment: how nodes are (re)assigned (module docstring).
    restarts: independent runs of lines 17-21 from new random starts (``"paper"`` and
        ``"balanced"``), keeping the lowest combined cost (Eq. 12, with the first run's
        normalisers). Alg. 1 runs once; k-medoids' usual remedy for a start whose
        medoids share a site (PAM's restarts, scikit-learn's ``n_init``).

    Returns
    -------
    ICResult
        Labels, medoids, iterations and the final combined cost (of the kept run).
    """
    dist = check_square(distance, "distance matrix", symmetric=True, non_negative=True)
    n_nodes = len(dist)
    k = check_n_groups(n_groups, n_nodes)
    n = np.asarray(n_samples, np.float64)
    if n.shape != (n_nodes,) or (n <= 0).any():
        raise GroupingError(f"need a positive sample count for each of the {n_nodes} nodes")
    if alpha_iid < 0 or alpha_comm < 0 or alpha_iid + alpha_comm == 0:
        raise GroupingError("α_iid and α_comm must be non-negative and not both zero")
    if gram is None:
        grads = np.asarray(gradients)
        if grads.ndim != 2 or len(grads) != n_nodes:
            raise GroupingError(f"need one gradient row per node ({n_nodes}), got shape {grads.shape}")
        gram = gram_matrix(grads.astype(np.float32, copy=False))
    if not np.isfinite(gram).all():
        raise GroupingError("gradients hold NaN or infinite values")
    if assignment not in ASSIGNMENTS:
        raise GroupingError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {assignment!r}")
    rng = as_generator(random_state)
    if restarts < 1:
        raise GroupingError(f"restarts must be at least 1, got {restarts!r}")
    if assignment != "descent":
        norms: dict[str, float] = {}
        runs = [
            _simultaneous(
                gram, n, dist, k, alpha_iid, alpha_comm, max_iter, rng, balanced=assignment == "balanced", norms=norms
            )
            for _ in range(restarts)
        ]
        return min(runs, key=lambda r: r.cost)  # the first of equal costs
    medoids = rng.choice(n_nodes, size=k, replace=False)
    labels = np.argmin(dist[:, medoids], axis=1)
    labels[medoids] = np.arange(k)
    update_iid = _iid_update_cost(gram, n)
    norm: dict[str, float] = {}

    def scaled(key: str, value: np.ndarray) -> np.ndarray:
        if key not in norm:
            norm[key] = float(np.mean(value)) or 1.0
        return value / norm[key]

    scaled("A_iid", _iid_assign_cost(gram, n, labels, k))  # fixes the normalisers (first values)
    scaled("A_comm", dist[:, medoids])
    state = _Memberships(gram, n, labels, k)

    def sweep(meds: np.ndarray) -> bool:
        """Reassign every non-medoid node once; True if any node moved."""
        moved = False
        fixed = set(meds.tolist())
        for i in rng.permutation(n_nodes):
            if i in fixed:
                continue
            cost = alpha_iid * state.iid_row(i) / norm["A_iid"] + alpha_comm * dist[i, meds] / norm["A_comm"]
            best = int(np.argmin(cost))
            if best != state.labels[i]:
                state.move(i, best)
                moved = True
        return moved

    for g, m in enumerate(medoids):
        if state.labels[m] != g:
            state.move(int(m), g)
    sweep(medoids)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        new_medoids = medoids.copy()
        for g in range(k):
            members = np.flatnonzero(state.labels == g)
            if not len(members):
                continue
            u = alpha_iid * scaled("U_iid", update_iid)[members] + alpha_comm * scaled(
                "U_comm", dist[np.ix_(members, members)].sum(1)
            )
            new_medoids[g] = members[np.argmin(u)]
        for g, m in enumerate(new_medoids):
            if state.labels[m] != g:
                state.move(int(m), g)
        moved = sweep(new_medoids)
        steady = not moved and np.array_equal(new_medoids, medoids)
        medoids = new_medoids
        if steady:
            break
    labels = state.labels
    total = float(
        sum(
            alpha_iid * state.iid_row(i)[labels[i]] / norm["A_iid"]
            + alpha_comm * dist[i, medoids[labels[i]]] / norm["A_comm"]
            for i in range(n_nodes)
        )
    )
    return ICResult(labels.astype(np.int64), medoids, n_iter, total)


def _simultaneous(
    gram: np.ndarray,
    n: np.ndarray,
    dist: np.ndarray,
    k: int,
    alpha_iid: float,
    alpha_comm: float,
    max_iter: int,
    rng: np.random.Generator,
    *,
    balanced: bool,
    norms: dict[str, float],
) -> ICResult:
    """Alg. 1 lines 1 and 17-21 with every node moved at once; ``balanced``: each
    group ``floor(n / K)`` or ``ceil(n / K)`` nodes (module docstring). ``norms``: the
    normalisers of Eq. (12), filled by the first run and kept by restarts."""
    n_nodes = len(dist)
    if balanced:  # line 1's random membership, as even as the cap asks
        labels = np.empty(n_nodes, np.int64)
        labels[rng.permutation(n_nodes)] = np.arange(n_nodes) % k
        medoids = np.array([rng.choice(np.flatnonzero(labels == g)) for g in range(k)])
    else:
        labels = rng.integers(0, k, size=n_nodes)
        medoids = rng.choice(n_nodes, size=k, replace=False)  # line 17
        labels[medoids] = np.arange(k)
    update_iid = _iid_update_cost(gram, n)
    # footnote 2: each part normalised by its first value; a restart keeps the first
    # run's normalisers, so the runs' final costs compare
    c_iid = norms.setdefault("A_iid", float(np.mean(_iid_assign_cost(gram, n, labels, k))) or 1.0)
    c_comm = norms.setdefault("A_comm", float(np.mean(dist[:, medoids])) or 1.0)
    c_u = norms

    def assign_cost(current: np.ndarray, meds: np.ndarray) -> np.ndarray:  # Eq. (10), (12)
        return alpha_iid * _iid_assign_cost(gram, n, current, k) / c_iid + alpha_comm * dist[:, meds] / c_comm

    def assign(cost: np.ndarray, meds: np.ndarray) -> np.ndarray:
        if not balanced:
            out = np.argmin(cost, axis=1)
            out[meds] = np.arange(k)
            return out
        # each group floor(n/K) slots that must be filled (a bonus far above any cost) and
        # one more that may be: the sizes are floor(n/K) or ceil(n/K)
        floor = n_nodes // k
        slots = np.concatenate([np.repeat(np.arange(k), floor), np.arange(k)])
        wide = cost[:, slots] - np.where(np.arange(len(slots)) < k * floor, MUST_FILL, 0.0)[None, :]
        for g, m in enumerate(meds):  # a medoid stays in its group
            wide[m, slots != g] = np.inf
        rows, cols = linear_sum_assignment(np.where(np.isfinite(wide), wide, 1e18))
        out = np.empty(n_nodes, np.int64)
        out[rows] = slots[cols]
        return out

    def update(current: np.ndarray, meds: np.ndarray) -> np.ndarray:  # line 20, Eq. (11)
        new = meds.copy()
        for g in range(k):
            members = np.flatnonzero(current == g)
            if not len(members):
                continue
            comm = dist[np.ix_(members, members)].sum(1)
            c_u.setdefault("U_iid", float(np.mean(update_iid)) or 1.0)
            c_u.setdefault("U_comm", float(np.mean(comm)) or 1.0)
            u = alpha_iid * update_iid[members] / c_u["U_iid"] + alpha_comm * comm / c_u["U_comm"]
            new[g] = members[np.argmin(u)]
        return new

    labels = assign(assign_cost(labels, medoids), medoids)  # line 18
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # lines 19-21
        new_medoids = update(labels, medoids)
        new_labels = assign(assign_cost(labels, new_medoids), new_medoids)
        steady = np.array_equal(new_labels, labels) and np.array_equal(new_medoids, medoids)
        labels, medoids = new_labels, new_medoids
        if steady:
            break
    final = assign_cost(labels, medoids)
    total = float(final[np.arange(n_nodes), labels].sum())
    return ICResult(labels.astype(np.int64), medoids, n_iter, total)


def largest_group_share(labels: np.ndarray) -> float:
    """The largest group's share of the nodes (1.0: everyone in one group)."""
    return float(np.bincount(np.asarray(labels)).max() / len(labels)) if len(labels) else 0.0


class FedAvgICGrouping:
    """FedAvg-IC grouping as an estimator: ``fit(gradients, n_samples, distance)``
    sets ``labels_``, ``medoids_``, ``n_iter_``."""

    def __init__(
        self,
        n_groups: int,
        *,
        alpha_iid: float = 1.0,
        alpha_comm: float = 1.0,
        max_iter: int = 50,
        random_state: RandomState = None,
    ) -> None:
        if not isinstance(n_groups, (int, np.integer)) or n_groups < 1:
            raise GroupingError(f"n_groups must be a positive integer, got {n_groups!r}")
        self.n_groups, self.alpha_iid, self.alpha_comm = int(n_groups), alpha_iid, alpha_comm
        self.max_iter, self.random_state = max_iter, random_state

    def fit(self, gradients: np.ndarray, n_samples: np.ndarray, distance: np.ndarray) -> FedAvgICGrouping:
        res = fedavg_ic_groups(
            gradients,
            n_samples,
            distance,
            self.n_groups,
            alpha_iid=self.alpha_iid,
            alpha_comm=self.alpha_comm,
            max_iter=self.max_iter,
            random_state=self.random_state,
        )
        self.labels_, self.medoids_, self.n_iter_, self.cost_ = res.labels, res.medoids, res.n_iter, res.cost
        return self
