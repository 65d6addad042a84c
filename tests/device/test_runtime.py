"""LiteRT runtime: learning, exact weight round-trips, refusal of bad input."""

from __future__ import annotations

import json
import mmap
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from device.errors import DataError, ModelError, WeightsError
from device.runtime import TFLiteModel

DIGITS = 10


def _subset(x: np.ndarray, y: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    keep = y < n_classes
    return x[keep], y[keep]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "lr", "steps", "min_accuracy"),
    [
        ("mclr_femnist", 0.005, 500, 0.15),
        ("mlp_femnist", 0.01, 500, 0.15),
        ("cnn_femnist", 0.02, 500, 0.12),
        ("mclr_mnist", 0.01, 400, 0.40),
        ("mlp_mnist", 0.005, 400, 0.40),
        ("cnn_mnist", 0.05, 400, 0.40),
    ],
)
def test_a_few_hundred_steps_learn_femnist(zoo_model, femnist_pooled, name, lr, steps, min_accuracy) -> None:
    # Prepare: FEMNIST (62 classes) or its digits (10 classes)
    model = TFLiteModel(zoo_model(name))
    x_tr, y_tr, x_te, y_te = femnist_pooled
    if model.manifest.n_classes == DIGITS:
        x_tr, y_tr = _subset(x_tr, y_tr, DIGITS)
        x_te, y_te = _subset(x_te, y_te, DIGITS)
    before = model.evaluate(x_te, y_te)

    # Execute
    result = model.train(x_tr, y_tr, epochs=50, batch_size=10, lr=lr, max_steps=steps, seed=3)
    after = model.evaluate(x_te, y_te)

    # Assert: loss falls, accuracy far above chance (1/62 or 1/10)
    assert result.n_steps == steps
    assert after.loss < before.loss - 0.2
    assert after.accuracy >= min_accuracy
    assert after.accuracy >= 4 / model.manifest.n_classes


def test_mclr_synthetic_learns_a_planted_linear_rule(zoo_model) -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(60, 10))
    x = rng.normal(size=(3000, 60)).astype(np.float32)
    y = (x @ w).argmax(1)
    model = TFLiteModel(zoo_model("mclr_synthetic"))

    model.train(x[:2500], y[:2500], epochs=5, batch_size=10, lr=0.05, seed=0)

    assert model.evaluate(x[2500:], y[2500:]).accuracy > 0.8


def test_epochs_visit_every_sample_including_the_last_partial_batch(zoo_model) -> None:
    model = TFLiteModel(zoo_model("mclr_synthetic"))
    x = np.random.default_rng(1).normal(size=(23, 60)).astype(np.float32)
    y = np.arange(23) % 10

    result = model.train(x, y, epochs=2, batch_size=10, lr=0.01, seed=0)

    assert result.n_steps == 6  # 10 + 10 + 3, twice
    assert result.n_samples == 23


def test_training_is_deterministic_for_a_seed(zoo_model) -> None:
    x = np.random.default_rng(2).normal(size=(50, 60)).astype(np.float32)
    y = np.arange(50) % 10
    a = TFLiteModel(zoo_model("mclr_synthetic"))
    b = TFLiteModel(zoo_model("mclr_synthetic"))

    wa = a.train(x, y, epochs=2, batch_size=7, lr=0.05, seed=11).weights
    wb = b.train(x, y, epochs=2, batch_size=7, lr=0.05, seed=11).weights
    wc = b.train(x, y, epochs=2, batch_size=7, lr=0.05, seed=12, initial_weights=a.get_weights()).weights

    np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(wa, wc)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mclr_synthetic", "mlp_femnist", "cnn_femnist"])
def test_set_weights_of_get_weights_is_exact(zoo_model, name: str) -> None:
    model = TFLiteModel(zoo_model(name))
    w = np.random.default_rng(4).normal(size=model.n_params).astype(np.float32)

    model.set_weights(w)
    first = model.get_weights()
    model.set_weights(first)

    np.testing.assert_array_equal(first, w)
    np.testing.assert_array_equal(model.get_weights(), w)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp_mnist", "cnn_femnist"])
def test_per_tensor_reads_and_writes_agree_with_the_flat_signatures(zoo_model, name: str) -> None:
    """The runtime moves weights through get_tensors/set_tensors (less memory); the
    spec's flat get_weights/set_weights signatures must see the same weights, also
    when the interpreter offers no output views (the copying fallback)."""
    model = TFLiteModel(zoo_model(name))
    w = np.random.default_rng(5).normal(size=model.n_params).astype(np.float32)

    model.set_weights(w)  # set_tensors
    np.testing.assert_array_equal(model._runner("get_weights")()["weights"], w)
    model._runner("set_weights")(weights=w[::-1].copy())
    np.testing.assert_array_equal(model.get_weights(), w[::-1])  # get_tensors, read through views

    real = model._runner("get_tensors")
    model._runners["get_tensors"] = lambda **inputs: real(**inputs)  # a runner without view access
    np.testing.assert_array_equal(model.get_weights(), w[::-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the runtime releases pages on Linux only")
def test_the_weight_signatures_give_back_their_copies_of_the_weights(zoo_model) -> None:
    """set_tensors' inputs and get_tensors' outputs each hold a whole model for the life
    of the interpreter; once the weights are copied, the runtime releases their pages,
    which then read as zeros (except where a page is shared with a neighbour)."""
    model = TFLiteModel(zoo_model("mlp_femnist"))
    w = np.random.default_rng(6).normal(size=model.n_params).astype(np.float32)

    model.set_weights(w)
    got = model.get_weights()

    np.testing.assert_array_equal(got, w)
    set_io, get_io = model._tensor_io("set_tensors"), model._tensor_io("get_tensors")
    assert set_io is not None and get_io is not None
    edge = 2 * mmap.PAGESIZE // 4  # floats on the two partial pages at a tensor's ends
    for t in model.manifest.tensors:
        if t.size * 4 >= 4 * mmap.PAGESIZE:
            assert np.count_nonzero(set_io.input(t.name.replace("/", "_"))) <= edge
            assert np.count_nonzero(get_io.output(t.name.replace("/", "_"))) <= edge
    # released buffers are ordinary memory for the next copy in and out
    model.set_weights(w[::-1].copy())
    np.testing.assert_array_equal(model.get_weights(), w[::-1])


def test_an_interpreter_that_keeps_its_pages_trains_to_the_same_weights(zoo_model) -> None:
    """``release_memory=False`` (the simulator's interpreter, which loads a model for
    every task) skips the releases and nothing else: the weight signatures' buffers
    keep their copies, and training from the same start gives the same weights."""
    path = zoo_model("mlp_femnist")
    keeping, releasing = TFLiteModel(path, release_memory=False), TFLiteModel(path)
    rng = np.random.default_rng(9)
    x = rng.random((30, 784), dtype=np.float32)
    y = rng.integers(0, 62, 30)
    start = rng.normal(scale=0.05, size=keeping.n_params).astype(np.float32)

    kept = keeping.train(x, y, batch_size=10, lr=0.05, seed=2, initial_weights=start.copy(), reuse_start=True)
    released = releasing.train(x, y, batch_size=10, lr=0.05, seed=2, initial_weights=start.copy())

    np.testing.assert_array_equal(kept.weights, released.weights)
    set_io = keeping._tensor_io("set_tensors")
    assert set_io is not None
    for t in keeping.manifest.tensors:  # still the start's values: nothing was given back
        held = set_io.input(t.name.replace("/", "_")).reshape(-1)
        np.testing.assert_array_equal(held, start[t.offset : t.offset + t.size])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the runtime releases pages on Linux only")
def test_copy_out_copies_exactly_and_gives_back_the_source_pages_chunk_by_chunk() -> None:
    """get_weights copies each output chunk by chunk, releasing what it has copied, so
    the source never sits beside a whole copy; chunk ends need not fall on pages."""
    from device.runtime import _pages

    rng = np.random.default_rng(7)
    src = rng.normal(size=300_001).astype(np.float32)  # ~1.2 MB: several chunks, odd size
    want = src.copy()
    dst = np.empty_like(src)

    _pages.copy_out(src, dst, chunk_bytes=12_345)

    np.testing.assert_array_equal(dst, want)
    edge = 2 * mmap.PAGESIZE // 4  # floats on the two partial pages at the buffer's ends
    assert np.count_nonzero(src) <= edge


@pytest.mark.slow
def test_priming_the_fold_in_arena_leaves_training_unchanged(zoo_model) -> None:
    """Allocating flush's tensors before the first deferred step computes nothing: the
    trained weights are bit for bit those of training without it."""
    path = zoo_model("cnn_femnist")
    rng = np.random.default_rng(8)
    x = rng.random((40, 784), dtype=np.float32)
    y = rng.integers(0, 62, 40)
    primed, unprimed = TFLiteModel(path), TFLiteModel(path)
    unprimed._primed.add("flush")  # as if already allocated: no priming happens
    start = primed.get_weights()

    a = primed.train(x, y, epochs=2, batch_size=8, lr=0.05, seed=4, initial_weights=start).weights
    b = unprimed.train(x, y, epochs=2, batch_size=8, lr=0.05, seed=4, initial_weights=start).weights

    assert "flush" in primed._primed
    assert not np.array_equal(a, start)
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mclr_synthetic", "cnn_femnist"])
def test_training_into_the_start_buffer_gives_the_same_weights_in_that_buffer(zoo_model, name: str) -> None:
    """``reuse_start``: the result takes the start's buffer (one model less at the peak)
    and is bit for bit the result of training into a new one; a buffer that cannot hold
    it (here: read-only) is left alone."""
    model = TFLiteModel(zoo_model(name))
    rng = np.random.default_rng(3)
    x = rng.random((40, *model.manifest.input_shape), dtype=np.float32)
    y = rng.integers(0, model.manifest.n_classes, 40)
    start = rng.normal(scale=0.05, size=model.n_params).astype(np.float32)
    given = start.copy()
    frozen = start.copy()
    frozen.flags.writeable = False

    fresh = model.train(x, y, epochs=2, batch_size=8, lr=0.05, seed=4, initial_weights=start).weights
    reused = model.train(x, y, epochs=2, batch_size=8, lr=0.05, seed=4, initial_weights=given, reuse_start=True)
    kept = model.train(x, y, epochs=2, batch_size=8, lr=0.05, seed=4, initial_weights=frozen, reuse_start=True)

    assert reused.weights is given and not np.array_equal(given, start)
    np.testing.assert_array_equal(reused.weights, fresh)
    assert kept.weights is not frozen and np.array_equal(frozen, start)
    np.testing.assert_array_equal(kept.weights, fresh)


def test_weights_survive_a_batch_size_change(zoo_model) -> None:
    """Resizing inputs (last partial batch) must not reset the variables."""
    model = TFLiteModel(zoo_model("mlp_mnist"))
    x = np.random.default_rng(0).random((13, 784), dtype=np.float32)
    y = np.arange(13) % 10
    model.train(x, y, epochs=1, batch_size=10, lr=0.1, seed=0)
    w = model.get_weights()

    model.evaluate(x[:3], y[:3])
    model.evaluate(x, y, batch_size=7)

    np.testing.assert_array_equal(model.get_weights(), w)


# -- bad input ------------------------------------------------------------------------------
@pytest.fixture
def model_copy(zoo_model, tmp_path: Path) -> Path:
    src = zoo_model("mclr_mnist")
    dst = tmp_path / "m.tflite"
    shutil.copy(src, dst)
    shutil.copy(src.with_suffix(".json"), dst.with_suffix(".json"))
    return dst


def test_a_model_whose_sha256_does_not_match_is_refused(model_copy: Path) -> None:
    data = bytearray(model_copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model_copy.write_bytes(bytes(data))

    with pytest.raises(ModelError, match="sha256"):
        TFLiteModel(model_copy)


def test_a_missing_manifest_is_refused(model_copy: Path) -> None:
    model_copy.with_suffix(".json").unlink()

    with pytest.raises(ModelError, match=r"manifest .* not found"):
        TFLiteModel(model_copy)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: "{not json", "not valid JSON"),
        (lambda m: json.dumps({**m, "n_params": m["n_params"] + 1}), "n_params"),
        (lambda m: json.dumps({k: v for k, v in m.items() if k != "sha256"}), "sha256"),
        (lambda m: json.dumps({**m, "input_shape": [0]}), "input_shape"),
        (lambda m: json.dumps({**m, "format": 99}), "format"),
        (lambda m: json.dumps([1, 2]), "JSON object"),
        (lambda m: json.dumps({**m, "accumulate_chunk": 16}), "accumulate/apply_accumulated signatures"),
        (lambda m: json.dumps({**m, "accumulate_chunk": -1}), "accumulate_chunk must be"),
    ],
)
def test_a_malformed_manifest_is_refused(model_copy: Path, edit, message: str) -> None:
    path = model_copy.with_suffix(".json")
    path.write_text(edit(json.loads(path.read_text())))

    with pytest.raises(ModelError, match=message):
        TFLiteModel(model_copy)


def test_bad_weights_are_refused_and_change_nothing(zoo_model) -> None:
    model = TFLiteModel(zoo_model("mclr_mnist"))
    before = model.get_weights()
    nan = before.copy()
    nan[3] = np.nan

    with pytest.raises(WeightsError, match="shape"):
        model.set_weights(before[:-1])
    with pytest.raises(WeightsError, match="NaN"):
        model.set_weights(nan)
    with pytest.raises(WeightsError, match="NaN"):
        model.set_weights(np.full_like(before, np.inf))
    with pytest.raises(WeightsError, match="dtype"):
        model.set_weights(np.zeros(before.shape, np.int32))

    np.testing.assert_array_equal(model.get_weights(), before)


def test_data_that_does_not_fit_the_model_is_refused(zoo_model) -> None:
    model = TFLiteModel(zoo_model("mclr_mnist"))
    before = model.get_weights()
    x = np.zeros((4, 784), np.float32)

    with pytest.raises(DataError, match="shape"):
        model.train(np.zeros((4, 60), np.float32), np.zeros(4, int))
    with pytest.raises(DataError, match="10 classes"):
        model.train(x, np.array([0, 1, 2, 10]))
    with pytest.raises(DataError, match="10 classes"):
        model.train(x, np.array([0, -1, 2, 3]))
    with pytest.raises(DataError, match="labels have shape"):
        model.train(x, np.zeros(3, int))
    with pytest.raises(DataError, match="NaN"):
        model.train(np.full((4, 784), np.nan, np.float32), np.zeros(4, int))
    with pytest.raises(DataError, match="empty"):
        model.evaluate(np.zeros((0, 784), np.float32), np.zeros(0, int))

    np.testing.assert_array_equal(model.get_weights(), before)


@pytest.mark.parametrize(
    ("value", "finite"), [(np.nan, False), (np.inf, False), (-np.inf, False), (3e38, True), (-3e38, True), (0.0, True)]
)
def test_one_non_finite_value_anywhere_makes_an_array_non_finite_and_large_finite_ones_do_not(
    value: float, finite: bool
) -> None:
    """The check every weight vector and data set passes (``_all_finite``): one value
    decides it wherever it sits, and values whose sum would overflow float32 are
    still finite."""
    from device.runtime import _all_finite

    for where in (0, 4_999, 9_999):
        arr = np.full(10_000, np.float32(3e38))
        arr[where] = np.float32(value)
        assert _all_finite(arr) is finite
    assert _all_finite(np.zeros(0, np.float32))
