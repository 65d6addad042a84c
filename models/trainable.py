"""A zoo architecture as a ``tf.Module`` whose signatures train with builtin ops only.

Signatures (every one converts with ``TFLITE_BUILTINS`` alone):

``train(x, y, lr) -> loss``
    One SGD step on a batch (any batch size): ``w <- w - lr * dL/dw``.
``train_prox(x, y, lr, mu) -> loss``
    One FedProx step (Li et al., MLSys 2020, Eq. 2): the local objective adds
    ``mu/2 * ||w - w_anchor||^2``, so ``w <- w - lr * (dL/dw + mu * (w - w_anchor))``.
    ``loss`` is the data loss without the proximal term (what FedProx reports).
``set_anchor() -> n_params``
    Copy the current weights into the anchor (call it after loading the round's
    global model).
``infer(x) -> logits``; ``evaluate(x, y) -> loss, correct``
``gradients(x, y) -> gradients``
    The flat gradient of the mean loss on a batch (used by DSC and FedAvg-IC).
``get_weights() -> weights``; ``set_weights(weights) -> n_params``
    All trainable tensors as one flat float32 vector, in manifest order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from models.layers import Tensor, softmax_cross_entropy
from models.zoo import Architecture


class TrainableModel(tf.Module):
    """Variables plus hand-written forward/backward passes for one architecture."""

    def __init__(self, arch: Architecture, seed: int = 0) -> None:
        super().__init__(name=arch.name)
        self.arch = arch
        self.specs = arch.param_specs()
        initial = arch.initial_weights(seed)
        self.weights = [
            tf.Variable(value, name=spec.name.replace("/", "_"))
            for spec, value in zip(self.specs, initial, strict=True)
        ]
        self.anchor = [
            tf.Variable(value, name="anchor_" + spec.name.replace("/", "_"))
            for spec, value in zip(self.specs, initial, strict=True)
        ]
        self.n_params = arch.n_params
        self._slices: list[tuple[int, int]] = []
        start = 0
        for layer in arch.layers:
            count = len(layer.params("p"))
            self._slices.append((start, start + count))
            start += count

        x_spec = tf.TensorSpec([None, *arch.input_shape], tf.float32, name="x")
        y_spec = tf.TensorSpec([None], tf.int32, name="y")
        scalar = tf.TensorSpec([], tf.float32)
        flat = tf.TensorSpec([self.n_params], tf.float32, name="weights")
        self.train = tf.function(self._train, input_signature=[x_spec, y_spec, scalar])
        self.train_prox = tf.function(
            self._train_prox, input_signature=[x_spec, y_spec, scalar, scalar]
        )
        self.set_anchor = tf.function(self._set_anchor, input_signature=[])
        self.infer = tf.function(self._infer, input_signature=[x_spec])
        self.evaluate = tf.function(self._evaluate, input_signature=[x_spec, y_spec])
        self.gradients = tf.function(self._gradients, input_signature=[x_spec, y_spec])
        self.get_weights = tf.function(self._get_weights, input_signature=[])
        self.set_weights = tf.function(self._set_weights, input_signature=[flat])

    # -- passes -------------------------------------------------------------------
    def _layer_weights(self, values: list[Tensor], i: int) -> list[Tensor]:
        start, stop = self._slices[i]
        return values[start:stop]

    def _forward(self, x: Tensor, values: list[Tensor]) -> tuple[Tensor, list[dict[str, Tensor]]]:
        caches = []
        for i, layer in enumerate(self.arch.layers):
            x, cache = layer.forward(x, self._layer_weights(values, i))
            caches.append(cache)
        return x, caches

    def _backward(
        self, grad: Tensor, caches: list[dict[str, Tensor]], values: list[Tensor], scale: Tensor
    ) -> list[Tensor]:
        """Scaled parameter gradients in ``self.weights`` order."""
        per_layer: list[list[Tensor]] = [[] for _ in self.arch.layers]
        first_with_params = min(i for i, (a, b) in enumerate(self._slices) if b > a)
        for i in range(len(self.arch.layers) - 1, -1, -1):
            layer = self.arch.layers[i]
            need_input_grad = i > first_with_params
            grad_in, grads = layer.backward(
                grad, caches[i], self._layer_weights(values, i), scale, need_input_grad
            )
            per_layer[i] = grads
            if not need_input_grad:
                break
            grad = grad_in
        return [g for grads in per_layer for g in grads]

    def _loss_and_deltas(
        self, x: Tensor, y: Tensor, scale: Tensor
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        values = [w.read_value() for w in self.weights]
        logits, caches = self._forward(x, values)
        loss, dlogits, _ = softmax_cross_entropy(logits, y, self.arch.n_classes)
        return loss, values, self._backward(dlogits, caches, values, scale)

    # -- signatures ---------------------------------------------------------------
    def _train(self, x: Tensor, y: Tensor, lr: Tensor) -> dict[str, Tensor]:
        loss, values, deltas = self._loss_and_deltas(x, y, -lr)
        for var, value, delta in zip(self.weights, values, deltas, strict=True):
            var.assign(value + delta)
        return {"loss": loss}

    def _train_prox(self, x: Tensor, y: Tensor, lr: Tensor, mu: Tensor) -> dict[str, Tensor]:
        loss, values, deltas = self._loss_and_deltas(x, y, -lr)
        step = lr * mu
        for var, anchor, value, delta in zip(self.weights, self.anchor, values, deltas, strict=True):
            var.assign(value + delta - step * (value - anchor.read_value()))
        return {"loss": loss}

    def _set_anchor(self) -> dict[str, Tensor]:
        for var, anchor in zip(self.weights, self.anchor, strict=True):
            anchor.assign(var.read_value())
        return {"n_params": tf.constant(self.n_params, tf.int32)}

    def _infer(self, x: Tensor) -> dict[str, Tensor]:
        logits, _ = self._forward(x, [w.read_value() for w in self.weights])
        return {"logits": logits}

    def _evaluate(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        logits, _ = self._forward(x, [w.read_value() for w in self.weights])
        loss, _, correct = softmax_cross_entropy(logits, y, self.arch.n_classes)
        return {"loss": loss, "correct": correct}

    def _gradients(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        _, _, grads = self._loss_and_deltas(x, y, tf.constant(1.0))
        return {"gradients": tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)}

    def _get_weights(self) -> dict[str, Tensor]:
        return {"weights": tf.concat([tf.reshape(w.read_value(), [-1]) for w in self.weights], 0)}

    def _set_weights(self, weights: Tensor) -> dict[str, Tensor]:
        offset = 0
        for var, spec in zip(self.weights, self.specs, strict=True):
            var.assign(tf.reshape(weights[offset : offset + spec.size], spec.shape))
            offset += spec.size
        return {"n_params": tf.constant(self.n_params, tf.int32)}

    def signatures(self) -> dict[str, Any]:
        """Concrete functions keyed by signature name, for ``tf.saved_model.save``."""
        return {
            name: getattr(self, name).get_concrete_function()
            for name in (
                "train", "train_prox", "set_anchor", "infer", "evaluate",
                "gradients", "get_weights", "set_weights",
            )
        }


def flat_weights(values: list[np.ndarray]) -> np.ndarray:
    """Concatenate tensors into the flat float32 vector the signatures use."""
    return np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in values])
