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
    slightly = np.array([41.0, 29.0, 21.0, 9.0])  # mean |change| = 1
    half = np.array([10.0, 30.0, 20.0, 40.0])  # 30 samples relabelled: mean |change| = 15
    assert label_shift(old, slightly) == pytest.approx(1.0)
    assert not needs_migration(old, slightly)
    assert needs_migration(old, half)


def test_label_w1_uses_label_positions() -> None:
    assert label_w1(np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0])) == pytest.approx(2.0)


def test_bad_histograms_are_refused() -> None:
    with pytest.raises(GroupingError, match="shape"):
        label_shift(np.ones(3), np.ones(4))
    with pytest.raises(GroupingError, match="non-negative"):
        label_shift(np.ones(3), np.array([1.0, -1.0, 2.0]))
