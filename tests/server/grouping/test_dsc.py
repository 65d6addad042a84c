"""DSC (dual-segment clustering): primary groups from SNR blocks, Ξ, nearest-group joins."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import GroupingError
from server.grouping.dsc import DualSegmentClustering, _join_nearest, dsc_groups, label_information


def _block_snr(sizes: list[int], seed: int = 0) -> np.ndarray:
    """SNR (dB): ~25 dB inside a block, ~3 dB across blocks, symmetric."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    block = np.repeat(np.arange(len(sizes)), sizes)
    snr = np.where(block[:, None] == block[None, :], 25.0, 3.0) + rng.normal(0, 0.5, (n, n))
    snr = (snr + snr.T) / 2
    np.fill_diagonal(snr, 15.0)
    return snr


def test_clients_with_clear_snr_blocks_are_separated() -> None:
    snr = _block_snr([6, 6, 6])
    counts = np.random.default_rng(1).integers(1, 30, (18, 10)).astype(float)
    truth = np.repeat([0, 1, 2], 6)

    primary, final = dsc_groups(snr, counts, random_state=0)

    # every primary group lies inside one SNR block, and all three blocks are found
    for p in np.unique(primary):
        assert len(set(truth[primary == p])) == 1
    assert len(np.unique(primary)) == 3
    # secondary groups refine the primary ones
    for g in np.unique(final):
        assert len(set(primary[final == g])) == 1
    assert (final >= 0).all()


def test_label_information_matches_equation_12_by_hand() -> None:
    counts = np.array([[2.0, 0.0], [1.0, 1.0]])  # D = 4, D_1 = 2, D_2 = 2, C^1 = 3, C^2 = 1

    xi = label_information(counts)

    expected_11 = -(2 / 4) * np.log(4 * 2 / (2 * 3))
    expected_21 = -(1 / 4) * np.log(4 * 1 / (2 * 3))
    expected_22 = -(1 / 4) * np.log(4 * 1 / (2 * 1))
    np.testing.assert_allclose(xi, [[expected_11, 0.0], [expected_21, expected_22]])


def test_unassigned_clients_join_the_nearest_group() -> None:
    xi = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0], [4.8, 4.9], [0.2, 0.1]])
    labels = np.array([0, 0, 1, 1, -1, -1])

    _join_nearest(labels, xi)

    assert labels.tolist() == [0, 0, 1, 1, 1, 0]


def test_estimator_and_bad_input() -> None:
    est = DualSegmentClustering(random_state=0).fit(_block_snr([4, 4]), np.ones((8, 3)))
    assert est.labels_.shape == (8,) and est.n_groups_ >= 2
    with pytest.raises(GroupingError, match="square"):
        dsc_groups(np.zeros((3, 4)), np.ones((3, 2)))
    with pytest.raises(GroupingError, match="symmetric"):
        dsc_groups(np.array([[0.0, 1.0], [2.0, 0.0]]), np.ones((2, 2)))
    with pytest.raises(GroupingError, match="clients"):
        dsc_groups(np.zeros((3, 3)), np.ones((4, 2)))
    with pytest.raises(GroupingError, match="snr_similarity"):
        DualSegmentClustering(snr_similarity="fancy")


def test_paper_similarity_is_equation_8_as_printed_on_power_ratios() -> None:
    from server.grouping.dsc import snr_similarity_matrix

    # the letter's link budget: a strong pair (-35 dB) and a weak one (-115 dB)
    snr = np.array([[-20.0, -35.0, -115.0], [-35.0, -20.0, -60.0], [-115.0, -60.0, -20.0]])

    paper = snr_similarity_matrix(snr, "paper")
    profile = snr_similarity_matrix(snr, "profile")

    np.testing.assert_allclose(paper, -((10 ** (snr / 10)) ** 2))
    assert paper[0, 1] < paper[0, 2]  # printed Eq. 8: the strong pair is the less similar
    assert profile[0, 1] > profile[0, 2]  # covey's default: clients with alike links are similar
