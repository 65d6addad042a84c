"""The parsed-data cache: a second load reads the same arrays back; a changed file re-parses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from device.data import read_leaf
from server.simulation.data_cache import CacheOutcome
from server.simulation.datasets import Federation, leaf_with_cache


def _write_leaf(root: Path, users: dict[str, int], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for part in ("train", "test"):
        (root / part).mkdir(parents=True, exist_ok=True)
        data = {u: {"x": rng.random((n, 6)).tolist(), "y": rng.integers(0, 4, n).tolist()} for u, n in users.items()}
        doc = {"users": list(users), "num_samples": list(users.values()), "user_data": data}
        (root / part / "all_data_0.json").write_text(json.dumps(doc))


def _assert_same(a: Federation, b: Federation) -> None:
    assert list(a) == list(b)
    for u in a:
        for part in ("train", "test"):
            x, y = getattr(a[u], part), getattr(b[u], part)
            assert x.x.dtype == y.x.dtype and x.y.dtype == y.y.dtype
            np.testing.assert_array_equal(x.x, y.x)
            np.testing.assert_array_equal(x.y, y.y)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COVEY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_second_load_hits_the_cache_with_identical_arrays(tmp_path: Path, cache: Path) -> None:
    _write_leaf(tmp_path / "leaf", {"w1": 5, "w0": 3, "empty": 0})

    first, outcome1 = leaf_with_cache(tmp_path / "leaf")
    second, outcome2 = leaf_with_cache(tmp_path / "leaf")

    assert (outcome1, outcome2) == (CacheOutcome.MISS, CacheOutcome.HIT)
    _assert_same(first, second)
    parsed = read_leaf(tmp_path / "leaf" / "train")  # what the reader gives without a cache
    for u, data in parsed.items():
        np.testing.assert_array_equal(second[u].train.x, data.x)
        assert second[u].train.x.shape == data.x.shape
    entries = list((cache / "data").glob("*.npz"))
    assert len(entries) == 1
    with np.load(entries[0], allow_pickle=False) as archive:  # plain arrays, no pickled objects
        assert all(archive[name].dtype != object for name in archive.files)


def test_changing_a_file_invalidates_the_entry(tmp_path: Path, cache: Path) -> None:
    _write_leaf(tmp_path / "leaf", {"w0": 4})
    before, _ = leaf_with_cache(tmp_path / "leaf")
    _write_leaf(tmp_path / "leaf", {"w0": 4}, seed=1)  # same users and sizes, other samples

    after, outcome = leaf_with_cache(tmp_path / "leaf")

    assert outcome is CacheOutcome.MISS
    assert not np.array_equal(before["w0"].train.x, after["w0"].train.x)
    np.testing.assert_array_equal(after["w0"].train.x, read_leaf(tmp_path / "leaf" / "train")["w0"].x)
    assert len(list((cache / "data").glob("*.npz"))) == 1  # the stale entry is gone


def test_a_damaged_entry_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    _write_leaf(tmp_path / "leaf", {"w0": 4})
    first, _ = leaf_with_cache(tmp_path / "leaf")
    (entry,) = (cache / "data").glob("*.npz")
    entry.write_bytes(b"not a zip file")

    again, outcome = leaf_with_cache(tmp_path / "leaf")

    assert outcome is CacheOutcome.MISS
    _assert_same(first, again)


def test_an_unwritable_cache_still_gives_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("COVEY_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be created
    _write_leaf(tmp_path / "leaf", {"w0": 4})

    fed, outcome = leaf_with_cache(tmp_path / "leaf")

    assert outcome is CacheOutcome.UNSTORED
    np.testing.assert_array_equal(fed["w0"].test.y, read_leaf(tmp_path / "leaf" / "test")["w0"].y)


def test_the_cache_lives_under_xdg_cache_home_unless_covey_cache_dir_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.paths import cache_dir

    monkeypatch.delenv("COVEY_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "covey"
    monkeypatch.setenv("COVEY_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
