"""k-medoids on a precomputed distance matrix (Park & Jun 2009, the "simple and fast"
alternating algorithm FedAvg-IC cites): pick medoids, assign every point to its
nearest medoid, move each medoid to the member with the least total distance to its
group, repeat until nothing changes. Used by FedGroup's EDC-matrix option and by
HierFAVG's grouping by measured RTT."""

from __future__ import annotations

import numpy as np

from server.grouping._checks import RandomState, as_generator, check_n_groups, check_square


def kmedoids(
    distance: np.ndarray, n_clusters: int, *, max_iter: int = 100, random_state: RandomState = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Return ``(labels, medoid_indices, n_iter)``. Seeding is k-means++-like on the
    distances, so it is reproducible for a seed and robust to bad starts."""
    d = check_square(distance, "distance matrix", symmetric=True, non_negative=True)
    n = len(d)
    k = check_n_groups(n_clusters, n, "n_clusters")
    rng = as_generator(random_state)
    medoids = [int(rng.integers(n))]
    for _ in range(1, k):
        closest = d[:, medoids].min(1) ** 2
        closest[medoids] = 0
        total = closest.sum()
        choice = rng.choice(n, p=closest / total) if total > 0 else rng.choice(np.setdiff1d(np.arange(n), medoids))
        medoids.append(int(choice))
    med = np.array(medoids)
    labels = np.argmin(d[:, med], axis=1)
    labels[med] = np.arange(k)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        new_med = med.copy()
        for c in range(k):
            members = np.flatnonzero(labels == c)
            if len(members):
                new_med[c] = members[np.argmin(d[np.ix_(members, members)].sum(1))]
        new_labels = np.argmin(d[:, new_med], axis=1)
        new_labels[new_med] = np.arange(k)
        if np.array_equal(new_med, med) and np.array_equal(new_labels, labels):
            break
        med, labels = new_med, new_labels
    return labels.astype(np.int64), med, n_iter
