"""The hand-written backward passes equal tf.GradientTape's gradients, and the
train signatures apply exactly the SGD / FedProx update."""

from __future__ import annotations

import numpy as np
import pytest

from device.runtime import TFLiteModel
from models.keras_reference import from_keras_weights, keras_model, to_keras_weights
from models.zoo import ZOO, get_architecture

RTOL = 1e-5


def _batch(name: str, n: int = 6, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    arch = get_architecture(name)
    rng = np.random.default_rng(seed)
    x = rng.random((n, *arch.input_shape), dtype=np.float32)
    y = rng.integers(0, arch.n_classes, n).astype(np.int32)
    return x, y


def _tape_gradients(name: str, flat: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Reference: Keras forward pass in float64, tf.GradientTape backward pass."""
    import keras
    import tensorflow as tf

    arch = get_architecture(name)
    keras.backend.set_floatx("float64")
    try:
        model = keras_model(arch)
        model.set_weights([w.astype(np.float64) for w in to_keras_weights(arch, flat)])
        with tf.GradientTape() as tape:
            logits = model(tf.constant(x, tf.float64))
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.constant(y), logits=logits))
        grads = tape.gradient(loss, model.trainable_weights)
    finally:
        keras.backend.set_floatx("float32")
    return from_keras_weights(arch, [g.numpy() for g in grads]).astype(np.float64)


def _per_tensor_relative_error(model: TFLiteModel, got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    errors = {}
    for t in model.manifest.tensors:
        a = got[t.offset : t.offset + t.size].astype(np.float64)
        b = want[t.offset : t.offset + t.size]
        errors[t.name] = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    return errors


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_backward_pass_matches_gradient_tape(zoo_model, name: str) -> None:
    # Prepare: weights moved away from the init so biases are non-zero
    model = TFLiteModel(zoo_model(name))
    rng = np.random.default_rng(7)
    flat = model.get_weights()
    flat = flat + rng.normal(0, 0.02, flat.shape).astype(np.float32)
    model.set_weights(flat)
    x, y = _batch(name)

    # Execute
    got = model.gradients(x, y)
    want = _tape_gradients(name, flat, x, y)

    # Assert: every trainable tensor within 1e-5 relative
    errors = _per_tensor_relative_error(model, got, want)
    assert max(errors.values()) <= RTOL, errors
    assert np.linalg.norm(want) > 0


@pytest.mark.parametrize("name", ["mlp_mnist", "cnn_mnist"])
def test_train_step_is_exactly_sgd(zoo_model, name: str) -> None:
    model = TFLiteModel(zoo_model(name))
    x, y = _batch(name, n=5)
    w0 = model.get_weights()
    g = model.gradients(x, y)

    model.train(x, y, epochs=1, batch_size=5, lr=0.1, seed=None)

    np.testing.assert_allclose(model.get_weights(), w0 - 0.1 * g, rtol=1e-5, atol=1e-6)


def test_fedprox_step_adds_the_proximal_gradient(zoo_model) -> None:
    # Prepare: anchor = w0, then train from a point w1 away from the anchor
    model = TFLiteModel(zoo_model("mclr_mnist"))
    x, y = _batch("mclr_mnist", n=5)
    w0 = model.get_weights()
    w1 = w0 + 0.05
    model._runner("set_anchor")()  # anchor at w0
    model.set_weights(w1)
    g = model.gradients(x, y)

    # Execute: one prox step without resetting the anchor
    model._runner("train_prox")(x=x, y=y.astype(np.int32), lr=np.float32(0.1), mu=np.float32(0.5))

    # Assert: w2 = w1 - lr * (g + mu * (w1 - w0))
    np.testing.assert_allclose(model.get_weights(), w1 - 0.1 * (g + 0.5 * (w1 - w0)), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "rank", "batch", "n"), [("cnn_femnist", 128, 5, 150), ("mlp_femnist", 40, 10, 200)])
def test_deferred_updates_train_exactly_like_plain_sgd(zoo_model, name: str, rank: int, batch: int, n: int) -> None:
    """cnn_femnist defers its 3136x2048 kernel's updates as low-rank factors, and
    mlp_femnist its 784x512 kernel's; an epoch crosses fold-ins (128 and 40 rows) and
    must match immediate SGD. (A larger learning rate lets roundoff-level ties in
    max-pool windows flip, a discrete change that is not what this test is about.)"""
    plain = TFLiteModel(zoo_model(name))
    fast = TFLiteModel(zoo_model(name))
    assert fast.manifest.deferred_rank == rank
    rng = np.random.default_rng(5)
    x = rng.random((n, 784), dtype=np.float32)
    y = rng.integers(0, 62, n)

    a = plain.train(x, y, epochs=1, batch_size=batch, lr=0.005, seed=9, deferred=False)
    b = fast.train(x, y, epochs=1, batch_size=batch, lr=0.005, seed=9)

    assert "flush" in fast._runners and "flush" not in plain._runners  # each took its path
    assert a.n_steps == b.n_steps == n // batch
    assert abs(a.mean_loss - b.mean_loss) < 1e-4 * abs(a.mean_loss)
    rel = np.linalg.norm(a.weights - b.weights) / np.linalg.norm(a.weights)
    moved = np.linalg.norm(a.weights - TFLiteModel(zoo_model(name)).get_weights())
    assert rel < 1e-5
    assert moved > 0


def test_batches_of_more_than_half_the_pending_rows_train_plainly(zoo_model) -> None:
    """With one batch per fold-in a deferred step would do a plain step's work and the
    factors' besides, so mlp_femnist (40 rows) trains batch 21 and up with ``train``,
    bit for bit as ``deferred=False`` does, and batch 20 deferred."""
    rng = np.random.default_rng(6)
    x = rng.random((84, 784), dtype=np.float32)
    y = rng.integers(0, 62, 84)
    start = TFLiteModel(zoo_model("mlp_femnist")).get_weights()
    for batch, defers in ((20, True), (21, False), (32, False)):
        model, plain = TFLiteModel(zoo_model("mlp_femnist")), TFLiteModel(zoo_model("mlp_femnist"))

        got = model.train(x, y, batch_size=batch, lr=0.01, seed=1, initial_weights=start).weights
        want = plain.train(x, y, batch_size=batch, lr=0.01, seed=1, initial_weights=start, deferred=False).weights

        assert ("train_deferred" in model._runners) == defers, batch
        if not defers:
            np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_after_a_flush_every_signature_agrees_with_plain_sgd(zoo_model) -> None:
    """Pending rows live only until ``flush``; after it get_weights, evaluate and
    gradients see exactly the plain-SGD weights."""
    model = TFLiteModel(zoo_model("cnn_femnist"))
    reference = TFLiteModel(zoo_model("cnn_femnist"))
    x, y = _batch("cnn_femnist", n=5)

    model._runner("train_deferred")(x=x, y=y, lr=np.float32(0.1), slot=np.int32(0))
    model._runner("flush")()
    reference._runner("train")(x=x, y=y, lr=np.float32(0.1))

    np.testing.assert_allclose(model.get_weights(), reference.get_weights(), rtol=1e-5, atol=1e-7)
    assert model.evaluate(x, y).loss == pytest.approx(reference.evaluate(x, y).loss, rel=1e-5)
    np.testing.assert_allclose(model.gradients(x, y), reference.gradients(x, y), rtol=1e-4, atol=1e-6)


def test_runtime_training_leaves_no_pending_rows(zoo_model) -> None:
    model = TFLiteModel(zoo_model("cnn_femnist"))
    x, y = _batch("cnn_femnist", n=12)
    result = model.train(x, y, batch_size=5, lr=0.01, seed=0)
    assert model._pending_rows == 0
    np.testing.assert_array_equal(result.weights, model.get_weights())


def _moved(w: np.ndarray, seed: int) -> np.ndarray:
    return w + np.random.default_rng(seed).normal(0, 0.02, w.shape).astype(np.float32)


def _write_set_weights(model: TFLiteModel, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    model._runner("set_weights")(weights=_moved(w, 1))  # the flat signature, not set_tensors


def _write_set_tensors(model: TFLiteModel, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    model.set_weights(_moved(w, 2))  # the runtime uses set_tensors


def _write_train(model: TFLiteModel, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    model._runner("train")(x=x, y=y, lr=np.float32(0.5))


def _write_train_prox(model: TFLiteModel, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    model.set_weights(_moved(w, 3))
    model._runner("set_anchor")()
    model.set_weights(w)
    model._runner("train_prox")(x=x, y=y, lr=np.float32(0.5), mu=np.float32(1.0))


def _write_flush(model: TFLiteModel, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    model._runner("train_deferred")(x=x, y=y, lr=np.float32(0.5), slot=np.int32(0))
    model._runner("flush")()


@pytest.mark.slow
@pytest.mark.parametrize(
    "write", [_write_set_weights, _write_set_tensors, _write_train, _write_train_prox, _write_flush]
)
def test_kernel_mirror_follows_every_write_of_its_kernel(zoo_model, write) -> None:
    """The FEMNIST CNN keeps W^T of its 3136x2048 kernel for the input gradient. After
    each signature that writes W, gradients at the weights get_weights reports must
    equal GradientTape's: a stale mirror would give wrong gradients to both conv layers."""
    # Prepare
    model = TFLiteModel(zoo_model("cnn_femnist"))
    x, y = _batch("cnn_femnist", n=5)
    w0 = model.get_weights()

    # Execute
    write(model, w0, x, y)
    w1 = model.get_weights()
    got = model.gradients(x, y)

    # Assert: the weights moved, and the gradients there are right for every tensor
    assert np.abs(w1 - w0).max() > 1e-3
    for t in model.manifest.tensors:  # not a dead network, whose zero gradients any mirror fits
        assert np.linalg.norm(got[t.offset : t.offset + t.size]) > 0, t.name
    errors = _per_tensor_relative_error(model, got, _tape_gradients("cnn_femnist", w1, x, y))
    assert max(errors.values()) <= RTOL, errors
