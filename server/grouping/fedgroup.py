"""FedGroup group cold start and newcomer assignment (Duan et al., FedGroup, Sec. III-C/D;
reused by FlexCFL).

Group cold start (Alg. 3): ``α·m`` clients pre-train from the initial model; their
updates ΔW (n x d) are decomposed into ``m`` directions V by a truncated SVD; each
update is described by its cosine similarity to those directions,
``S(i, v) = cos(Δw_i, v)`` (n x m); the clients are clustered on that embedding.

* ``measure="edc"`` (default): k-means++ on the rows of S. EDC(i, j) of Eq. (8) is
  ``||S_i - S_j|| / m``, a Euclidean distance on those rows, so this *is* k-means under
  EDC (and it is what the public code does).
* ``measure="edc_matrix"``: builds the n x n EDC matrix of Eq. (8) and clusters it
  with k-medoids, i.e. with the distance itself rather than a vector embedding.
* ``measure="madc"``: MADC of Eq. (7), ``mean_{z != i, j} |S(i, z) - S(j, z)|`` on the
  full cosine matrix, clustered by complete-linkage agglomeration.

Memory and speed. Nothing here makes an n x d copy of the updates: the truncated SVD
comes from the n x n Gram matrix ``G = ΔW ΔWᵀ`` (accumulated over column blocks), since
with ``G = U Σ² Uᵀ`` the right singular vectors are ``V = ΔWᵀ U Σ⁻¹`` and so
``ΔW V = U Σ``: ``S(i, j) = U_ij σ_j / ||Δw_i||`` with ``||Δw_i|| = sqrt(G_ii)``. It is
exact (not randomised) and costs one pass over ΔW.

Newcomers (Eq. 9): a client that joins later pre-trains from the initial model and
joins the group minimising ``(1 - cos(Δw_g, Δw_i)) / 2``, where ``Δw_g`` is the group's
cold-start update direction (the unweighted mean of its members' updates).
"""

from __future__ import annotations

import numpy as np

from server.errors import GroupingError
from server.grouping._checks import RandomState, as_generator, check_matrix, check_n_groups
from server.grouping.kmedoids import kmedoids

MEASURES = ("edc", "edc_matrix", "madc")
GRAM_BLOCK = 1 << 18  # columns of ΔW per Gram block (n x 262144 float32 = 100 MB at n = 100)


def gram_matrix(updates: np.ndarray) -> np.ndarray:
    """``ΔW ΔWᵀ`` in float64, accumulated over column blocks of a float32 matrix."""
    n, d = updates.shape
    gram = np.zeros((n, n), np.float64)
    for start in range(0, d, GRAM_BLOCK):
        block = updates[:, start : start + GRAM_BLOCK]
        gram += (block @ block.T).astype(np.float64)
    return gram


def _check_updates(updates: np.ndarray) -> np.ndarray:
    if not isinstance(updates, np.ndarray) or updates.ndim != 2:
        raise GroupingError("updates must be a 2-D array (clients x parameters)")
    if updates.shape[0] == 0:
        raise GroupingError("updates is empty: no clients to group")
    if updates.dtype not in (np.float32, np.float64):
        updates = updates.astype(np.float32)
    return updates


def decomposed_cosine(updates: np.ndarray, n_directions: int, gram: np.ndarray | None = None) -> np.ndarray:
    """S (n x m): cosine of every update to the top ``m`` singular directions of ΔW."""
    updates = _check_updates(updates)
    g = gram_matrix(updates) if gram is None else gram
    if not np.isfinite(g).all():
        raise GroupingError("updates hold NaN or infinite values")
    norms = np.sqrt(np.maximum(np.diag(g), 0.0))
    if (norms == 0).any():
        raise GroupingError(f"client {int(np.argmin(norms))} sent an all-zero update; it has no direction")
    m = min(n_directions, len(g))
    eigval, eigvec = np.linalg.eigh(g)
    top = np.argsort(eigval)[::-1][:m]
    sigma = np.sqrt(np.maximum(eigval[top], 0.0))
    return eigvec[:, top] * sigma[None, :] / norms[:, None]


def edc_matrix(embedding: np.ndarray) -> np.ndarray:
    """EDC(i, j) = ||S_i - S_j|| / m (Eq. 8)."""
    m = embedding.shape[1]
    diff = embedding[:, None, :] - embedding[None, :, :]
    return np.sqrt((diff**2).sum(-1)) / m


def madc_matrix(cosine: np.ndarray) -> np.ndarray:
    """MADC(i, j) = mean over z != i, j of |S(i, z) - S(j, z)| (Eq. 7)."""
    n = len(cosine)
    if n < 3:
        return np.zeros((n, n))
    out = np.zeros((n, n))
    for i in range(n):
        diff = np.abs(cosine[i][None, :] - cosine)  # rows j, columns z
        diff[:, i] = 0.0
        diff[np.arange(n), np.arange(n)] = 0.0
        out[i] = diff.sum(1) / (n - 2)
    np.fill_diagonal(out, 0.0)
    return (out + out.T) / 2


def cold_start_groups(
    updates: np.ndarray, n_groups: int, *, measure: str = "edc", random_state: RandomState = None
) -> np.ndarray:
    """Group labels of the pre-trained clients (FedGroup Alg. 3)."""
    updates = _check_updates(updates)
    n = updates.shape[0]
    k = check_n_groups(n_groups, n)
    rng = as_generator(random_state)
    if measure not in MEASURES:
        raise GroupingError(f"unknown measure {measure!r}; choose one of {', '.join(MEASURES)}")
    gram = gram_matrix(updates)
    if measure == "madc":
        norms = np.sqrt(np.maximum(np.diag(gram), 1e-300))
        cosine = gram / norms[:, None] / norms[None, :]
        dist = madc_matrix(cosine)
        if k == 1:
            return np.zeros(n, np.int64)
        from scipy.cluster.hierarchy import fcluster, linkage  # here: SciPy is slow to import
        from scipy.spatial.distance import squareform

        tree = linkage(squareform(dist, checks=False), method="complete")
        return (fcluster(tree, t=k, criterion="maxclust") - 1).astype(np.int64)
    embedding = decomposed_cosine(updates, k, gram)
    if measure == "edc_matrix":
        labels, _, _ = kmedoids(edc_matrix(embedding), k, random_state=rng)
        return labels
    from sklearn.cluster import KMeans  # here: scikit-learn takes seconds to import

    km = KMeans(n_clusters=k, init="k-means++", n_init=10, max_iter=300, random_state=int(rng.integers(2**31 - 1)))
    return km.fit_predict(embedding).astype(np.int64)


def group_directions(updates: np.ndarray, labels: np.ndarray, n_groups: int) -> np.ndarray:
    """Each group's update direction: the unweighted mean of its members' updates."""
    updates = _check_updates(updates)
    out = np.zeros((n_groups, updates.shape[1]), np.float32)
    for g in range(n_groups):
        members = labels == g
        if members.any():
            out[g] = updates[members].mean(0)
    return out


def assign_newcomer(update: np.ndarray, directions: np.ndarray) -> int:
    """FedGroup Eq. (9): the group minimising ``(1 - cos(Δw_g, Δw_i)) / 2``."""
    u = np.asarray(update, np.float64).ravel()
    dirs = check_matrix(np.asarray(directions, np.float64), "group directions")
    if dirs.shape[1] != u.size:
        raise GroupingError(f"update has {u.size} parameters, group directions {dirs.shape[1]}")
    if not np.isfinite(u).all():
        raise GroupingError("newcomer update holds NaN or infinite values")
    norms = np.linalg.norm(dirs, axis=1) * np.linalg.norm(u)
    cos = np.divide(dirs @ u, norms, out=np.zeros(len(dirs)), where=norms > 0)
    return int(np.argmin((1.0 - cos) / 2.0))


class GroupColdStart:
    """FedGroup's group cold start as an estimator.

    ``GroupColdStart(n_groups=5).fit(updates)`` sets ``labels_``, ``directions_``
    (group update directions for newcomers) and ``n_iter_`` (1: one pass).
    """

    def __init__(self, n_groups: int, *, measure: str = "edc", random_state: RandomState = None) -> None:
        if measure not in MEASURES:
            raise GroupingError(f"unknown measure {measure!r}; choose one of {', '.join(MEASURES)}")
        if not isinstance(n_groups, (int, np.integer)) or n_groups < 1:
            raise GroupingError(f"n_groups must be a positive integer, got {n_groups!r}")
        self.n_groups, self.measure, self.random_state = int(n_groups), measure, random_state

    def fit(self, updates: np.ndarray) -> GroupColdStart:
        self.labels_ = cold_start_groups(updates, self.n_groups, measure=self.measure, random_state=self.random_state)
        self.directions_ = group_directions(updates, self.labels_, self.n_groups)
        self.n_iter_ = 1
        return self

    def assign(self, update: np.ndarray) -> int:
        return assign_newcomer(update, self.directions_)
