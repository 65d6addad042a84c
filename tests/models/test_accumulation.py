"""Gradient accumulation: a batch trained as chunks whose gradients are summed is
the same SGD (or FedProx) step as the whole batch through ``train``/``train_prox``."""

from __future__ import annotations

import numpy as np
import pytest

from device.runtime import TFLiteModel

MODEL = "cnn_mnist"  # the zoo model with accumulate_chunk (16)


def _data(n: int, seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# batch 32: chunks 16+16; batch 37 over 96 samples: 12+12+13, 12+12+13, then 11+11
@pytest.mark.parametrize(("batch", "mu"), [(32, 0.0), (37, 0.0), (32, 0.5)])
def test_accumulated_steps_equal_whole_batch_steps(zoo_model, batch: int, mu: float) -> None:
    # Prepare
    whole = TFLiteModel(zoo_model(MODEL))
    chunked = TFLiteModel(zoo_model(MODEL))
    start = whole.get_weights()
    assert chunked.manifest.accumulate_chunk == 16
    x, y = _data(96)

    # Execute: same batches (seed), whole-batch signatures against chunk sums
    a = whole.train(x, y, batch_size=batch, lr=0.1, mu=mu, seed=3, accumulate=False)
    b = chunked.train(x, y, batch_size=batch, lr=0.1, mu=mu, seed=3)

    # Verify: identical up to float summation order, and training did move the weights
    assert a.n_steps == b.n_steps == -(-96 // batch)
    assert b.mean_loss == pytest.approx(a.mean_loss, rel=1e-5)
    assert _relative(b.weights, a.weights) < 1e-5
    assert _relative(a.weights, start) > 1e-3


def test_accumulate_changes_no_weight_until_applied(zoo_model) -> None:
    model = TFLiteModel(zoo_model(MODEL))
    start = model.get_weights()
    x, y = _data(16)

    model._runner("accumulate")(x=x, y=y.astype(np.int32), weight=np.float32(1.0))
    unchanged = model.get_weights()
    model._runner("apply_accumulated")(lr=np.float32(0.1))

    np.testing.assert_array_equal(unchanged, start)
    reference = TFLiteModel(zoo_model(MODEL))
    reference._runner("train")(x=x, y=y.astype(np.int32), lr=np.float32(0.1))
    assert _relative(model.get_weights(), reference.get_weights()) < 1e-6


def test_setting_weights_discards_a_half_done_accumulation(zoo_model) -> None:
    """A step interrupted between chunks must not leak its partial sum into the next."""
    model = TFLiteModel(zoo_model(MODEL))
    fresh = TFLiteModel(zoo_model(MODEL))
    start = model.get_weights()
    x, y = _data(48)

    model._runner("accumulate")(x=x[:16], y=y[:16].astype(np.int32), weight=np.float32(0.5))
    a = model.train(x, y, batch_size=24, lr=0.1, seed=1, initial_weights=start)
    b = fresh.train(x, y, batch_size=24, lr=0.1, seed=1, initial_weights=start)

    np.testing.assert_array_equal(a.weights, b.weights)
