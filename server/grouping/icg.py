"""ICG: Inter-Cluster Grouping (FedGSP, Zeng et al. 2022, Sec. 3.3, Algorithm 2).

Clients are clustered by their class-count vectors ``V^k`` into ``L`` clusters of
*equal* size (the constrained k-means of Eq. 10-13), then each group takes one client
from every cluster, so every group's class distribution is close to the global one
(Proposition 2).

The cluster-assignment step (Eq. 10-13 with fixed centroids) is a transportation
problem solved exactly as a min-cost flow with OR-Tools ``SimpleMinCostFlow``:
one unit of supply per client, a demand of ``K/L`` per cluster, arc cost
``1/2 * ||V^k - C_l||^2``.

Speed. A flow over all ``K x L`` arcs (10⁶ at K = 10,000, L = 100) is slow to solve at
every iteration. covey first solves over each client's ``n_candidates`` nearest
clusters, then checks optimality over *all* arcs: an equal-size assignment is optimal
iff no cyclic exchange of clients between clusters lowers the cost, i.e. iff the graph
of cluster-to-cluster move costs ``min_{k in a} (d(k, b) - d(k, a))`` has no negative
cycle (Floyd-Warshall). If it has one, the iteration is re-solved with all arcs. So
every assignment is exactly optimal for its centroids, at a fraction of the cost (the
times: docs/results.md, "Grouping").

Departures from Algorithm 2, on purpose:

* Line 6 draws one client per cluster *at random*. Proposition 2 only makes the group
  centroids right in expectation; on the 51 FEMNIST writers the random draw leaves the
  median pairwise CPD of the groups little below random groups'. covey's default
  ``draw="balanced"`` keeps the structure (every group gets exactly one client of every
  cluster) but places each cluster's members by a min-cost matching
  (``scipy.optimize.linear_sum_assignment``): cluster by cluster, a member goes to the
  group whose running class distribution it brings closest to the global one, which
  reduces the CPD several times more (both draws measured in docs/results.md,
  "Grouping"). ``draw="random"`` is the paper's.
* Line 1 samples ``L * floor(K/L)`` clients and leaves the remaining ``K mod L`` out of
  the round. covey clusters the same number of clients but then appends each leftover
  client to a *different* group (the one whose class distribution it moves closest to
  the global distribution), so no client is silently never trained; groups then differ
  in size by at most one.
* The number of groups is ``floor(K/L)`` with ``L = floor(K/f(r))``: that equals
  ``f(r)`` when ``f(r)`` divides ``K`` and can exceed it otherwise (51 clients,
  ``f = 20``: ``L = 2`` clusters of 25, so 25 groups of two).
* ``f(r) >= K`` puts every client alone (FedAvg); ``f(r) = 1`` gives one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from server.errors import GroupingError
from server.grouping._checks import RandomState, as_generator, check_counts

COST_RESOLUTION = 1e6  # largest arc cost after scaling to integers
FULL_CHECK_MAX_CLUSTERS = 400
IcgDraw = Literal["balanced", "random"]
DRAWS: tuple[IcgDraw, ...] = ("balanced", "random")
LLOYD_WARMUP = 5  # unconstrained k-means steps before the constrained iterations


def _sq_distances(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Half squared Euclidean distances, clients x clusters (Eq. 10's cost)."""
    d = (points**2).sum(1)[:, None] + (centroids**2).sum(1)[None, :] - 2.0 * points @ centroids.T
    return 0.5 * np.maximum(d, 0.0)


def _kmeans_pp(points: np.ndarray, n_clusters: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007)."""
    centroids = np.empty((n_clusters, points.shape[1]))
    centroids[0] = points[rng.integers(len(points))]
    closest = ((points - centroids[0]) ** 2).sum(1)
    for i in range(1, n_clusters):
        total = closest.sum()
        idx = rng.choice(len(points), p=closest / total) if total > 0 else rng.integers(len(points))
        centroids[i] = points[idx]
        closest = np.minimum(closest, ((points - centroids[i]) ** 2).sum(1))
    return centroids


def _update_centroids(points: np.ndarray, labels: np.ndarray, centroids: np.ndarray) -> None:
    """Each centroid becomes the mean of its members (unchanged if it has none)."""
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    present, starts = np.unique(sorted_labels, return_index=True)
    sums = np.add.reduceat(points[order], starts, axis=0)
    sizes = np.diff(np.append(starts, len(labels)))
    centroids[present] = sums / sizes[:, None]


def _lloyd(points: np.ndarray, centroids: np.ndarray, n_iter: int) -> np.ndarray:
    """A few unconstrained k-means steps: cheap, and a better start for the exact
    equal-size iterations, which then converge in fewer min-cost-flow solves."""
    for _ in range(n_iter):
        _update_centroids(points, np.argmin(_sq_distances(points, centroids), axis=1), centroids)
    return centroids


def _solve_flow(cost: np.ndarray, size: int, candidates: np.ndarray | None) -> np.ndarray | None:
    """Exact min-cost equal-size assignment over the given arcs; None if infeasible."""
    n, n_clusters = cost.shape
    if candidates is None:
        tails = np.repeat(np.arange(n, dtype=np.int32), n_clusters)
        heads = np.tile(np.arange(n_clusters, dtype=np.int32), n)
    else:
        tails = np.repeat(np.arange(n, dtype=np.int32), candidates.shape[1])
        heads = candidates.reshape(-1).astype(np.int32)
    arc_cost = cost[tails, heads]
    scale = COST_RESOLUTION / max(float(arc_cost.max()), 1e-12)
    from ortools.graph.python import min_cost_flow  # here: OR-Tools is slow to import

    flow = min_cost_flow.SimpleMinCostFlow()
    arcs = flow.add_arcs_with_capacity_and_unit_cost(
        tails, heads + n, np.ones(len(tails), np.int64), np.rint(arc_cost * scale).astype(np.int64)
    )
    supplies = np.concatenate([np.ones(n, np.int64), np.full(n_clusters, -size, np.int64)])
    flow.set_nodes_supplies(np.arange(n + n_clusters, dtype=np.int32), supplies)
    status = flow.solve()
    if status != flow.OPTIMAL:
        if status == flow.INFEASIBLE:
            return None
        raise GroupingError(f"OR-Tools min-cost flow failed with status {status}")
    used = np.asarray(flow.flows(arcs)) > 0
    labels = np.empty(n, np.int64)
    labels[tails[used]] = heads[used]
    return labels


def is_optimal_equal_size_assignment(cost: np.ndarray, labels: np.ndarray, tol: float = 1e-9) -> bool:
    """True iff no cyclic exchange of clients between clusters lowers the total cost.

    ``move[a, b] = min over clients k in cluster a of cost[k, b] - cost[k, a]`` is the
    cheapest way to move one client from ``a`` to ``b``; an equal-size assignment is
    optimal iff this complete graph on clusters has no negative cycle.
    """
    n_clusters = cost.shape[1]
    own = cost[np.arange(len(labels)), labels]
    delta = cost - own[:, None]  # cost of moving each client to each cluster
    move = np.full((n_clusters, n_clusters), np.inf)
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(n_clusters + 1))
    for a in range(n_clusters):
        members = order[bounds[a] : bounds[a + 1]]
        if len(members):
            move[a] = delta[members].min(0)
    np.fill_diagonal(move, np.inf)
    dist = move.copy()
    scale = max(float(np.abs(cost).max()), 1.0)
    for k in range(n_clusters):
        dist = np.minimum(dist, dist[:, k : k + 1] + dist[k : k + 1, :])
        if (np.diagonal(dist) < -tol * scale).any():
            return False
    return True


def equal_size_kmeans(
    points: np.ndarray,
    n_clusters: int,
    *,
    max_iter: int = 10,
    n_candidates: int = 16,
    tol: float = 5e-3,
    random_state: RandomState = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Constrained k-means with clusters of exactly ``len(points) / n_clusters`` members.

    FedGSP Eq. (10)-(13): alternate an exact min-cost-flow assignment (fixed centroids)
    and a centroid update until the assignment stops changing or ``max_iter`` (τ)
    iterations ran, or the objective of Eq. (10) improved by less than ``tol``
    (relative). The centroids start from k-means++ refined by a few unconstrained
    Lloyd steps. Returns ``(labels, centroids, n_iter)``.
    """
    points = check_counts(points, "points")
    n = len(points)
    if n_clusters < 1 or n % n_clusters:
        raise GroupingError(f"{n} points cannot form {n_clusters} clusters of equal size")
    rng = as_generator(random_state)
    size = n // n_clusters
    if n_clusters == 1:
        return np.zeros(n, np.int64), points.mean(0, keepdims=True), 1
    if size == 1:
        return rng.permutation(n).astype(np.int64), points.copy(), 1
    centroids = _lloyd(points, _kmeans_pp(points, n_clusters, rng), LLOYD_WARMUP)
    labels = np.full(n, -1, np.int64)
    previous = np.inf
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        cost = _sq_distances(points, centroids)
        new = None
        if n_candidates < n_clusters:
            nearest = np.argpartition(cost, n_candidates - 1, axis=1)[:, :n_candidates]
            new = _solve_flow(cost, size, nearest)
            checkable = new is not None and n_clusters <= FULL_CHECK_MAX_CLUSTERS
            if checkable and not is_optimal_equal_size_assignment(cost, new):  # type: ignore[arg-type]
                new = None
        if new is None:
            new = _solve_flow(cost, size, None)
            if new is None:  # cannot happen: every client may join every cluster
                raise GroupingError("equal-size assignment is infeasible")
        objective = float(cost[np.arange(n), new].sum())
        _update_centroids(points, new, centroids)
        converged = np.array_equal(new, labels) or objective > (1.0 - tol) * previous
        labels, previous = new, objective
        if converged:
            break
    return labels, centroids, n_iter


@dataclass(frozen=True)
class _Layout:
    n_clusters: int
    cluster_size: int


def _layout(n_clients: int, n_groups: int) -> _Layout:
    n_clusters = n_clients // n_groups
    return _Layout(n_clusters, n_clients // n_clusters)


def icg_groups(
    counts: np.ndarray,
    n_groups: int,
    *,
    max_iter: int = 10,
    n_candidates: int = 16,
    draw: IcgDraw = "balanced",
    random_state: RandomState = None,
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """Group clients so every group's class distribution resembles the global one.

    FedGSP Algorithm 2. ``counts`` is the K x F matrix of class-count vectors;
    ``n_groups`` is f(r). Returns ``(groups, cluster_labels, n_iter)``: ``groups`` is a
    list of arrays of client indices (each in random order, one client per cluster plus
    at most one leftover at the end), ``cluster_labels[k]`` is client k's cluster (-1 for the
    leftovers of Algorithm 2 line 1). See the module docstring for the departures.
    """
    counts = check_counts(counts)
    n = len(counts)
    if not isinstance(n_groups, (int, np.integer)) or n_groups < 1:
        raise GroupingError(f"n_groups must be a positive integer, got {n_groups!r}")
    if draw not in DRAWS:
        raise GroupingError(f"draw must be one of {DRAWS}, got {draw!r}")
    rng = as_generator(random_state)
    if n_groups >= n:
        return [np.array([k]) for k in rng.permutation(n)], np.zeros(n, np.int64), 0
    if n_groups == 1:
        return [rng.permutation(n)], np.zeros(n, np.int64), 0  # one group: one cluster
    layout = _layout(n, int(n_groups))
    chosen = rng.permutation(n)
    clustered, leftovers = (
        chosen[: layout.n_clusters * layout.cluster_size],
        chosen[layout.n_clusters * layout.cluster_size :],
    )
    labels, _, n_iter = equal_size_kmeans(
        counts[clustered], layout.n_clusters, max_iter=max_iter, n_candidates=n_candidates, random_state=rng
    )
    cluster_labels = np.full(n, -1, np.int64)
    cluster_labels[clustered] = labels
    order = np.argsort(labels, kind="stable")
    members = clustered[order].reshape(layout.n_clusters, layout.cluster_size)  # row c: cluster c
    if draw == "balanced":
        members = _balanced_draw(members, counts, rng)
    else:
        members = rng.permuted(members, axis=1)  # Alg. 2 line 6: a random member per group
    members = rng.permuted(members, axis=0)  # a random chain order inside every group
    groups = [members[:, g].copy() for g in range(layout.cluster_size)]
    if len(leftovers):
        _place_leftovers(groups, leftovers, counts, rng)
    return groups, cluster_labels, n_iter


def _balanced_draw(members: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Re-place each cluster's members among the groups by min-cost matchings.

    ``members[c, g]`` is the client of cluster ``c`` in group ``g``. For every cluster in
    random order, the cost of putting member ``x`` into group ``g`` is the squared
    distance between the normalised class distribution of ``g`` (its other members plus
    ``x``) and the global distribution; a linear assignment minimises the total.
    """
    target = counts.sum(0) / max(float(counts.sum()), 1e-12)
    tt = float(target @ target)
    sums = counts[members].sum(0)  # groups x classes
    from scipy.optimize import linear_sum_assignment  # here: SciPy is slow to import

    out = members.copy()
    for c in rng.permutation(len(out)):
        x = counts[out[c]]  # members x classes
        others = sums - x  # each group without its cluster-c member
        # ||(o_g + x_i) / s_gi - t||^2 with s_gi = |o_g| + |x_i|, expanded so the only
        # members x groups x classes work is one matrix product
        s_gi = x.sum(1)[:, None] + others.sum(1)[None, :]
        sq = (x * x).sum(1)[:, None] + 2.0 * (x @ others.T) + (others * others).sum(1)[None, :]
        dot_t = (x @ target)[:, None] + (others @ target)[None, :]
        inv = np.divide(1.0, s_gi, out=np.zeros_like(s_gi), where=s_gi > 0)
        cost = sq * inv * inv - 2.0 * dot_t * inv + tt
        rows, cols = linear_sum_assignment(cost)
        placed = np.empty_like(out[c])
        placed[cols] = out[c][rows]
        out[c] = placed
        sums = others + counts[placed]
    return out


def _place_leftovers(
    groups: list[np.ndarray], leftovers: np.ndarray, counts: np.ndarray, rng: np.random.Generator
) -> None:
    """Append each leftover client to a distinct group, the one whose normalised class
    distribution it brings closest to the global distribution."""
    total = counts.sum(0)
    target = total / max(total.sum(), 1e-12)
    sums = np.array([counts[g].sum(0) for g in groups])
    free = np.ones(len(groups), bool)
    for k in rng.permutation(leftovers):
        with_k = sums + counts[k]
        dist = ((with_k / np.maximum(with_k.sum(1, keepdims=True), 1e-12) - target) ** 2).sum(1)
        dist[~free] = np.inf
        best = int(np.argmin(dist))
        groups[best] = np.append(groups[best], k)
        sums[best] = with_k[best]
        free[best] = False


class InterClusterGrouping:
    """ICG as an estimator: ``InterClusterGrouping(n_groups=10).fit(counts).groups_``.

    Parameters
    ----------
    n_groups:
        f(r), the number of groups asked for (see module docstring for the exact count).
    max_iter:
        τ, the most constrained k-means iterations.
    n_candidates:
        Nearest clusters per client in the first, sparse flow (exactness is checked).
    random_state:
        Seed or ``np.random.Generator`` for the client sample, k-means++ and the draw.

    Attributes
    ----------
    groups_: list of arrays of client indices.
    labels_: group index of every client.
    cluster_labels_: cluster of every client (-1 for leftovers).
    n_iter_: k-means iterations run.
    """

    def __init__(
        self,
        n_groups: int,
        *,
        max_iter: int = 10,
        n_candidates: int = 16,
        draw: IcgDraw = "balanced",
        random_state: RandomState = None,
    ) -> None:
        if not isinstance(n_groups, (int, np.integer)) or isinstance(n_groups, bool) or n_groups < 1:
            raise GroupingError(f"n_groups must be a positive integer, got {n_groups!r}")
        if max_iter < 1 or n_candidates < 1:
            raise GroupingError("max_iter and n_candidates must be at least 1")
        if draw not in DRAWS:
            raise GroupingError(f"draw must be one of {DRAWS}, got {draw!r}")
        self.n_groups = int(n_groups)
        self.draw = draw
        self.max_iter = max_iter
        self.n_candidates = n_candidates
        self.random_state = random_state

    def fit(self, counts: np.ndarray) -> InterClusterGrouping:
        groups, clusters, n_iter = icg_groups(
            counts,
            self.n_groups,
            max_iter=self.max_iter,
            n_candidates=self.n_candidates,
            draw=self.draw,
            random_state=self.random_state,
        )
        labels = np.empty(sum(len(g) for g in groups), np.int64)
        for i, g in enumerate(groups):
            labels[g] = i
        self.groups_, self.labels_, self.cluster_labels_, self.n_iter_ = groups, labels, clusters, n_iter
        return self
