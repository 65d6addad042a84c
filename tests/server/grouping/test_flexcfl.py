"""FlexCFL migration: label shift compared by label position, Eq. (9) threshold."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import wasserstein_distance

from server.errors import GroupingError
from server.grouping.flexcfl import label_shift, label_w1, needs_migration, shift_threshold


def test_a_permuted_label_histogram_triggers_migration() -> None:
    old = np.array([50.0, 30.0, 10.0, 10.0, 0.0])
    new = old[[4, 3, 2, 1, 0]]  # same counts, different labels

    # the public code's comparison (counts treated as samples) sees nothing
    assert wasserstein_distance(new, old) == 0.0
    assert needs_migration(old, new)
    assert label_w1(old, new) > 0


def test_small_changes_stay_below_the_equation_9_threshold() -> None:
    old = np.array([40.0, 30.0, 20.0, 10.0])
    tau = shift_threshold(100, 4)  # 0.2 * 100 / 4 = 5
    assert tau == pytest.approx(5.0)
    slightly = np.array([41.0, 29.0, 21.0, 9.0])  # 2 samples relabelled: d = 2 / 4
    half = np.array([10.0, 30.0, 20.0, 40.0])  # 30 samples relabelled: d = 30 / 4
    assert label_shift(old, slightly) == pytest.approx(0.5)
    assert not needs_migration(old, slightly)
    assert needs_migration(old, half)


def _relabel(counts: np.ndarray, m: float, src: int, dst: int) -> np.ndarray:
    out = counts.copy()
    out[src] -= m
    out[dst] += m
    return out


def test_migration_fires_at_20_percent_relabelled_samples_not_10() -> None:
    """Eq. (9): "20 % training data change will be considered as distribution shift"."""
    # Prepare: n = 100 samples over 4 labels, τ = 0.2 * 100 / 4 = 5
    old = np.array([40.0, 30.0, 20.0, 10.0])
    fifteen = _relabel(old, 15, 0, 3)
    twenty_five = _relabel(old, 25, 0, 3)
    spread = _relabel(_relabel(old, 10, 0, 2), 15, 1, 3)  # 25 samples over two label pairs

    # Execute
    d15, d25 = label_shift(old, fifteen), label_shift(old, twenty_five)

    # Assert: m relabelled samples are a distance of m / LabelSize
    assert d15 == pytest.approx(15 / 4) and d25 == pytest.approx(25 / 4)
    assert not needs_migration(old, fifteen)
    assert needs_migration(old, twenty_five)
    assert needs_migration(old, spread)


def test_added_samples_count_as_change() -> None:
    # Prepare: a client gains samples of one label (incremental data)
    old = np.array([40.0, 30.0, 20.0, 10.0])
    plus_15, plus_25 = old + np.array([0, 15, 0, 0]), old + np.array([0, 0, 0, 25])

    # Execute / Assert: a added samples are a distance of a / LabelSize
    assert label_shift(old, plus_15) == pytest.approx(15 / 4)
    assert label_shift(old, plus_25) == pytest.approx(25 / 4)
    assert not needs_migration(old, plus_15)
    assert needs_migration(old, plus_25)
    assert needs_migration(old, old + np.array([30, 0, 0, -10]))  # 30 added, 10 removed


def test_label_w1_uses_label_positions() -> None:
    assert label_w1(np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0])) == pytest.approx(2.0)


def test_bad_histograms_are_refused() -> None:
    with pytest.raises(GroupingError, match="shape"):
        label_shift(np.ones(3), np.ones(4))
    with pytest.raises(GroupingError, match="non-negative"):
        label_shift(np.ones(3), np.array([1.0, -1.0, 2.0]))
