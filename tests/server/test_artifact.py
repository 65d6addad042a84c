"""The device artifact: the model without initial values trains exactly like the model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from device.errors import ModelError
from device.manifest import load_manifest, manifest_path_for, parse_manifest
from device.runtime import TFLiteModel
from models.export import builtin_op_names, flex_ops
from server.artifact import device_artifact, strip_initial_values, write_device_artifact


def _device_copy(model_path: Path, tmp_path: Path) -> TFLiteModel:
    return TFLiteModel(write_device_artifact(model_path, tmp_path), num_threads=1)


# cnn_mnist at batch 20 accumulates its gradient over two chunks; its gradient sums
# start from zero constants that the converter shares with the zero biases
@pytest.mark.slow
@pytest.mark.parametrize(("name", "batch"), [("cnn_femnist", 5), ("mlp_mnist", 5), ("cnn_mnist", 20)])
def test_device_artifact_trains_exactly_like_the_model(zoo_model, tmp_path: Path, name: str, batch: int) -> None:
    # Prepare
    path = zoo_model(name)
    full = TFLiteModel(path, num_threads=1)
    device = _device_copy(path, tmp_path)
    start = full.get_weights()
    rng = np.random.default_rng(0)
    x = rng.random((23, *full.manifest.input_shape), dtype=np.float32)
    y = rng.integers(0, full.manifest.n_classes, 23)

    # Execute: plain (deferred or accumulated where the model has it) and FedProx training
    a = full.train(x, y, batch_size=batch, lr=0.05, seed=1, initial_weights=start)
    b = device.train(x, y, batch_size=batch, lr=0.05, seed=1, initial_weights=start)
    a_prox = full.train(x, y, batch_size=batch, lr=0.05, mu=0.1, seed=2, initial_weights=start)
    b_prox = device.train(x, y, batch_size=batch, lr=0.05, mu=0.1, seed=2, initial_weights=start)

    # Verify
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a_prox.weights, b_prox.weights)
    assert a.mean_loss == b.mean_loss
    assert device.evaluate(x, y) == full.evaluate(x, y)


@pytest.mark.slow
def test_device_artifact_is_small_builtin_only_and_says_it_has_no_weights(zoo_model, tmp_path: Path) -> None:
    path = zoo_model("cnn_femnist")
    original = path.read_bytes()
    stripped, manifest = device_artifact(original, json.loads(manifest_path_for(path).read_text()))

    assert len(stripped) < len(original) / 10  # 55 MB (weights and the kernel mirror) -> about 3 MB
    assert flex_ops(stripped) == []
    assert builtin_op_names(stripped) <= builtin_op_names(original)
    parsed = parse_manifest(manifest, "device manifest")
    assert parsed.initial_weights is False and parsed.sha256 != load_manifest(manifest_path_for(path)).sha256


def test_reading_weights_never_set_is_refused(zoo_model, tmp_path: Path) -> None:
    device = _device_copy(zoo_model("mclr_synthetic"), tmp_path)
    x = np.zeros((3, 60), np.float32)
    y = np.zeros(3, np.int64)
    for call in (
        device.get_weights,
        lambda: device.evaluate(x, y),
        lambda: device.train(x, y),
        lambda: device.gradients(x, y),
    ):
        with pytest.raises(ModelError, match="call set_weights"):
            call()
    device.set_weights(np.zeros(device.n_params, np.float32))
    assert not device.get_weights().any()


def test_what_is_not_a_covey_model_is_refused() -> None:
    with pytest.raises(ModelError, match="not a TFLite flatbuffer"):
        strip_initial_values(b"not a model at all")
