"""FedGroup cold start: EDC via the Gram matrix, MADC, planted clusters, newcomers."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from server.errors import GroupingError
from server.grouping.fedgroup import (
    GroupColdStart,
    assign_newcomer,
    cold_start_groups,
    decomposed_cosine,
    edc_matrix,
    madc_matrix,
)


def _planted(n_per: int = 12, k: int = 3, d: int = 5000, noise: float = 0.6, seed: int = 0):  # type: ignore[no-untyped-def]
    """Updates scattered around k random directions."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d))
    labels = np.repeat(np.arange(k), n_per)
    updates = centres[labels] + noise * rng.normal(size=(len(labels), d)) * np.linalg.norm(centres[0]) / np.sqrt(d)
    scale = rng.uniform(0.5, 2.0, len(labels))[:, None]  # cosine ignores length
    return (updates * scale).astype(np.float32), labels


def test_gram_based_decomposition_equals_cosine_to_singular_directions() -> None:
    updates, _ = _planted(n_per=5, d=400)
    _, _, vt = np.linalg.svd(updates.astype(np.float64), full_matrices=False)

    s = decomposed_cosine(updates, 3)

    direct = (updates @ vt[:3].T) / np.linalg.norm(updates, axis=1)[:, None]
    np.testing.assert_allclose(np.abs(s), np.abs(direct), atol=1e-5)  # singular vectors have a sign


@pytest.mark.parametrize("measure", ["edc", "edc_matrix", "madc"])
def test_planted_clusters_of_update_directions_are_recovered(measure: str) -> None:
    updates, truth = _planted()

    labels = cold_start_groups(updates, 3, measure=measure, random_state=0)

    assert adjusted_rand_score(truth, labels) == pytest.approx(1.0)


def test_edc_is_euclidean_distance_of_the_embedding_over_m() -> None:
    emb = np.array([[0.0, 1.0], [3.0, 5.0]])
    np.testing.assert_allclose(edc_matrix(emb), [[0.0, 2.5], [2.5, 0.0]])


def test_madc_by_hand() -> None:
    cos = np.array([[1.0, 0.2, 0.4], [0.2, 1.0, 0.8], [0.4, 0.8, 1.0]])
    madc = madc_matrix(cos)
    # MADC(0,1) = |S(0,2) - S(1,2)| / (3-2) = 0.4
    assert madc[0, 1] == pytest.approx(0.4)
    assert madc[0, 2] == pytest.approx(abs(0.2 - 0.8))
    np.testing.assert_allclose(madc, madc.T)


def test_newcomer_joins_the_group_with_the_closest_direction() -> None:
    updates, truth = _planted()
    est = GroupColdStart(3, random_state=0).fit(updates[:-3])
    newcomer = updates[-1]  # belongs to planted group 2

    g = est.assign(newcomer)

    members = np.flatnonzero(est.labels_ == g)
    assert set(truth[members]) == {truth[-1]}
    assert assign_newcomer(np.array([1.0, 0.0]), np.array([[0.0, 1.0], [1.0, 0.1]])) == 1


def test_bad_updates_are_refused() -> None:
    with pytest.raises(GroupingError, match="empty"):
        cold_start_groups(np.zeros((0, 4), np.float32), 2)
    with pytest.raises(GroupingError, match="all-zero"):
        cold_start_groups(np.zeros((4, 4), np.float32), 2)
    bad = np.ones((4, 4), np.float32)
    bad[1, 1] = np.nan
    with pytest.raises(GroupingError, match="NaN"):
        cold_start_groups(bad, 2)
    with pytest.raises(GroupingError, match="more than the 4 clients"):
        cold_start_groups(np.eye(4, dtype=np.float32), 5)
    with pytest.raises(GroupingError, match="measure"):
        GroupColdStart(2, measure="l2")
