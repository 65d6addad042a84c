"""Coordinate-wise median and trimmed mean (Yin et al., ICML 2018)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from server.aggregation.robust import combine, coordinate_median, trimmed_count, trimmed_mean
from server.errors import GroupingError


def _models(m: int, d: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, d).astype(np.float32) for _ in range(m)]


@pytest.mark.parametrize("m", [1, 2, 5, 6])
def test_the_median_is_numpys_per_coordinate_over_blocks(m: int) -> None:
    models = _models(m, 70_001)  # more than two blocks
    np.testing.assert_allclose(coordinate_median(models), np.median(np.stack(models), axis=0), rtol=1e-6)


@pytest.mark.parametrize(("m", "trim"), [(5, 0.2), (6, 0.2), (10, 0.1), (10, 0.3), (4, 0.0)])
def test_the_trimmed_mean_is_scipys(m: int, trim: float) -> None:
    models = _models(m, 40_000, seed=m)
    expected = stats.trim_mean(np.stack(models).astype(np.float64), trim, axis=0)
    np.testing.assert_allclose(trimmed_mean(models, trim), expected, rtol=1e-5, atol=1e-6)


def test_trimmed_count_is_floor_of_beta_m() -> None:
    assert [trimmed_count(m, 0.2) for m in (4, 5, 9, 10)] == [0, 1, 1, 2]


def test_one_scaled_model_moves_the_mean_but_not_the_robust_rules() -> None:
    # Prepare: five honest updates near 1, one boosted x100
    rng = np.random.default_rng(3)
    honest = [1 + 0.01 * rng.normal(size=1000).astype(np.float32) for _ in range(5)]
    models = [*honest, 100 * honest[0]]

    # Execute
    mean = combine(models, [1] * 6, rule="mean")
    median = combine(models, rule="median")
    trimmed = combine(models, rule="trimmed_mean", trim=0.2)

    # Assert
    assert np.abs(mean - 1).max() > 10
    assert np.abs(median - 1).max() < 0.05 and np.abs(trimmed - 1).max() < 0.05


def test_bad_input_is_a_grouping_error() -> None:
    with pytest.raises(GroupingError, match="zero models"):
        coordinate_median([])
    with pytest.raises(GroupingError, match="differ in shape"):
        trimmed_mean([np.zeros(3), np.zeros(4)], 0.1)
    with pytest.raises(GroupingError, match=r"\[0, 0.5\)"):
        trimmed_mean(_models(4, 3), 0.5)
    with pytest.raises(GroupingError, match="unknown aggregation"):
        combine(_models(2, 3), rule="mode")  # type: ignore[arg-type]
