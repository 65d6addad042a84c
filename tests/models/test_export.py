"""Every zoo model converts with TFLite builtin ops only."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.export import builtin_op_names, flex_ops
from models.zoo import ZOO

EXPECTED_PARAMS = {
    "mclr_synthetic": 610,
    "mclr_mnist": 7_850,
    "mclr_femnist": 48_670,
    "mlp_mnist": 101_770,
    "mlp_femnist": 433_726,
    "cnn_femnist": 6_603_710,
    "cnn_mnist": 50_186,
}


def test_zoo_parameter_counts_match_the_papers() -> None:
    assert {name: arch.n_params for name, arch in ZOO.items()} == EXPECTED_PARAMS


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_is_builtin_only_and_manifest_describes_it(zoo_model, name: str) -> None:
    # Prepare / Execute
    path = zoo_model(name)
    data = path.read_bytes()
    manifest = json.loads(path.with_suffix(".json").read_text())

    # Assert: no custom op, resource variables and a hand-written backward pass only
    assert flex_ops(data) == []
    ops = builtin_op_names(data)
    assert {"READ_VARIABLE", "ASSIGN_VARIABLE", "BATCH_MATMUL"} <= ops
    assert not any("GRAD" in op for op in ops)
    assert manifest["n_params"] == EXPECTED_PARAMS[name]
    assert manifest["model"] == name
    assert sum(int(np.prod(t["shape"])) for t in manifest["tensors"]) == manifest["n_params"]
    import hashlib

    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert set(manifest["signatures"]) >= {
        "train",
        "train_prox",
        "set_anchor",
        "infer",
        "evaluate",
        "get_weights",
        "set_weights",
        "gradients",
    }


@pytest.mark.slow
def test_flex_detector_catches_a_gradienttape_train_step() -> None:
    """The usual TFLite training recipe needs Flex ops; the detector must see them,
    and a builtins-only conversion of it must fail."""
    import tensorflow as tf

    class TapeModel(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.zeros([4, 3]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int32)])
        def train(self, x, y):  # type: ignore[no-untyped-def]
            with tf.GradientTape() as tape:
                logits = tf.nn.relu(x @ self.w)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            self.w.assign_sub(0.1 * tape.gradient(loss, self.w))
            return {"loss": loss}

    module = TapeModel()
    fn = module.train.get_concrete_function()

    def convert(ops):  # type: ignore[no-untyped-def]
        converter = tf.lite.TFLiteConverter.from_concrete_functions([fn], module)
        converter.target_spec.supported_ops = ops
        return converter.convert()

    with_flex = convert([tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS])
    assert any(op.startswith("Flex") for op in flex_ops(with_flex))
    with pytest.raises(Exception, match=r"(?i)select|flex|not supported|converter"):
        convert([tf.lite.OpsSet.TFLITE_BUILTINS])
