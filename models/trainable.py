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

Models with a deferred-update dense layer (see :class:`models.layers.Dense`) add:

``train_deferred(x, y, lr, slot) -> loss``
    The same SGD step as ``train``, but the large kernel's update is stored as
    factor rows ``slot .. slot+B-1`` instead of being added to the kernel. The caller
    keeps ``slot + B <= deferred_rank`` and calls ``flush`` before the rows run out.
``flush() -> n_params``
    Fold the pending factors into the kernel and clear them.

Models with ``accumulate_chunk`` set (see :class:`models.zoo.Architecture`) add:

``accumulate(x, y, weight) -> loss``
    Add ``weight`` times the gradient of the chunk's mean loss to gradient sums
    (``buffer_gradsum_*``); the weights do not change. With ``weight = n_chunk / n``
    for every chunk of a batch of ``n``, the sums are the batch's mean gradient.
``apply_accumulated(lr) -> n_params``
    ``w <- w - lr * sum`` and clear the sums: the SGD step of ``train`` on the whole
    batch. ``set_weights``/``set_tensors`` also clear the sums.
``apply_accumulated_prox(lr, mu) -> n_params``
    ``w <- w - lr * (sum + mu * (w - w_anchor))``: the FedProx step of ``train_prox``.
    (A separate signature: the SGD step must not read an anchor that a device
    artifact only has after ``set_anchor``.)

Contract: pending rows exist only between ``train_deferred`` calls and the next
``flush``; every other signature reads the kernels as they are, so call ``flush``
before any of them (``device.runtime.TFLiteModel.train`` does). Folding the factors
into every signature instead cost each of them a 26 MB product and sum on the FEMNIST
CNN, and each signature's arena the memory for them. A caller that never
uses ``train_deferred`` never sees pending rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from device.runtime import tensor_key  # the runtime finds get_tensors/set_tensors names by the same rule
from models.layers import Backward, Dense, ParamSpec, Tensor, softmax_cross_entropy
from models.quiet_tf import tensorflow
from models.zoo import Architecture

tf = tensorflow()  # building a model is what needs TensorFlow (quietly imported)
_Module: Any = tf.Module

MIRROR_PREFIX = "mirror_"  # transposed copies of weights (server.artifact strips their initial values)


def _var_name(prefix: str, name: str) -> str:
    return prefix + tensor_key(name)


class TrainableModel(_Module):  # a tf.Module
    """Variables plus hand-written forward/backward passes for one architecture."""

    def __init__(self, arch: Architecture, seed: int = 0) -> None:
        super().__init__(name=arch.name)
        self.arch = arch
        self.specs = arch.param_specs()
        initial = arch.initial_weights(seed)
        self.weights = [tf.Variable(v, name=_var_name("", s.name)) for s, v in zip(self.specs, initial, strict=True)]
        self.anchor = [
            tf.Variable(v, name=_var_name("anchor_", s.name)) for s, v in zip(self.specs, initial, strict=True)
        ]
        self.n_params = arch.n_params
        self._param_slices: list[tuple[int, int]] = []
        self._buffer_slices: list[tuple[int, int]] = []
        self._mirror_slices: list[tuple[int, int]] = []
        buffer_specs: list[ParamSpec] = []
        self.mirror_of: list[int] = []  # mirror i is the transpose of weights[mirror_of[i]]
        mirrors: list[Any] = []  # tf.Variable
        mirror_keys: list[str] = []
        p = 0
        for i, layer in enumerate(arch.layers):
            n_p, extra = len(layer.params("p")), layer.buffers(f"layer{i}")
            self._param_slices.append((p, p + n_p))
            self._buffer_slices.append((len(buffer_specs), len(buffer_specs) + len(extra)))
            buffer_specs.extend(extra)
            own_mirrors = layer.mirrors(f"layer{i}")
            self._mirror_slices.append((len(mirrors), len(mirrors) + len(own_mirrors)))
            for spec, index in own_mirrors:
                self.mirror_of.append(p + index)
                mirrors.append(tf.Variable(initial[p + index].T, name=_var_name(MIRROR_PREFIX, spec.name)))
                mirror_keys.append(spec.name.rsplit("/", 1)[-1])
            p += n_p
        self.buffers = [
            tf.Variable(np.zeros(s.shape, np.float32), name=_var_name("buffer_", s.name)) for s in buffer_specs
        ]
        self._buffer_keys = [s.name.rsplit("/", 1)[-1] for s in buffer_specs]
        self.mirrors = mirrors
        self._mirror_keys = mirror_keys
        self.deferred_rank = max((layer.deferred_rank for layer in arch.layers if isinstance(layer, Dense)), default=0)
        if arch.accumulate_chunk and self.deferred_rank:
            raise ValueError(f"{arch.name}: gradient accumulation and deferred updates do not combine")
        self.gradient_sums = [
            tf.Variable(np.zeros(s.shape, np.float32), name=_var_name("buffer_gradsum_", s.name))
            for s in (self.specs if arch.accumulate_chunk else [])
        ]

        x_spec = tf.TensorSpec([None, *arch.input_shape], tf.float32, name="x")
        y_spec = tf.TensorSpec([None], tf.int32, name="y")
        scalar = tf.TensorSpec([], tf.float32)
        flat = tf.TensorSpec([self.n_params], tf.float32, name="weights")
        self.train = tf.function(self._train, input_signature=[x_spec, y_spec, scalar])
        self.train_prox = tf.function(self._train_prox, input_signature=[x_spec, y_spec, scalar, scalar])
        self.set_anchor = tf.function(self._set_anchor, input_signature=[])
        self.infer = tf.function(self._infer, input_signature=[x_spec])
        self.evaluate = tf.function(self._evaluate, input_signature=[x_spec, y_spec])
        self.gradients = tf.function(self._gradients, input_signature=[x_spec, y_spec])
        self.get_weights = tf.function(self._get_weights, input_signature=[])
        self.set_weights = tf.function(self._set_weights, input_signature=[flat])
        self.get_tensors = tf.function(self._get_tensors, input_signature=[])
        per_tensor = [tf.TensorSpec(s.shape, tf.float32, name=tensor_key(s.name)) for s in self.specs]
        self.set_tensors = tf.function(self._set_tensors, input_signature=per_tensor)
        if arch.accumulate_chunk:
            weight = tf.TensorSpec([], tf.float32, name="weight")
            self.accumulate = tf.function(self._accumulate, input_signature=[x_spec, y_spec, weight])
            self.apply_accumulated = tf.function(self._apply_accumulated, input_signature=[scalar])
            self.apply_accumulated_prox = tf.function(self._apply_accumulated_prox, input_signature=[scalar, scalar])
        if self.deferred_rank:
            slot = tf.TensorSpec([], tf.int32, name="slot")
            self.train_deferred = tf.function(self._train_deferred, input_signature=[x_spec, y_spec, scalar, slot])
            self.flush = tf.function(self._flush, input_signature=[])

    # -- helpers ------------------------------------------------------------------
    def _of(self, values: list[Tensor], slices: list[tuple[int, int]], i: int) -> list[Tensor]:
        start, stop = slices[i]
        return values[start:stop]

    def _read_weights(self) -> list[Tensor]:
        return [w.read_value() for w in self.weights]

    def _read_state(self, with_buffers: bool) -> tuple[list[Tensor], list[Tensor]]:
        """Buffers (pending deferred updates; only when asked) and mirrors."""
        buffers = [b.read_value() for b in self.buffers] if with_buffers else []
        return buffers, [m.read_value() for m in self.mirrors]

    def _state(self, i: int, buffers: list[Tensor], mirrors: list[Tensor]) -> dict[str, Tensor]:
        """Layer ``i``'s buffers and mirrors by key (see ``Layer.buffers``)."""
        state: dict[str, Tensor] = {}
        if buffers:
            start, stop = self._buffer_slices[i]
            state.update(zip(self._buffer_keys[start:stop], buffers[start:stop], strict=True))
        if mirrors:
            start, stop = self._mirror_slices[i]
            state.update(zip(self._mirror_keys[start:stop], mirrors[start:stop], strict=True))
        return state

    def _assign_weights(self, new_values: list[Tensor | None]) -> None:
        """Write the weights that changed (``None``: unchanged), and their mirrors."""
        for var, value in zip(self.weights, new_values, strict=True):
            if value is not None:
                var.assign(value)
        for mirror, source in zip(self.mirrors, self.mirror_of, strict=True):
            if new_values[source] is not None:
                mirror.assign(tf.transpose(new_values[source]))

    def _effective(self, values: list[Tensor], buffers: list[Tensor]) -> list[Tensor | None]:
        """Kernels with pending deferred updates folded in (``None`` for the others)."""
        out: list[Tensor | None] = [None] * len(values)
        for i, layer in enumerate(self.arch.layers):
            state = self._state(i, buffers, [])
            if state and isinstance(layer, Dense):
                start, _ = self._param_slices[i]
                out[start] = layer.effective_kernel(values[start], state)
        return out

    def _forward(
        self, x: Tensor, values: list[Tensor], buffers: list[Tensor], mirrors: list[Tensor]
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        caches = []
        for i, layer in enumerate(self.arch.layers):
            own_values = self._of(values, self._param_slices, i)
            x, cache = layer.forward(x, own_values, self._state(i, buffers, mirrors))
            caches.append(cache)
        return x, caches

    def _backward(
        self,
        grad: Tensor,
        caches: list[dict[str, Tensor]],
        values: list[Tensor],
        buffers: list[Tensor],
        mirrors: list[Tensor],
        scale: Tensor,
        defer: bool,
    ) -> list[Backward | None]:
        """Per-layer backward results (``None`` below the first layer with parameters)."""
        results: list[Backward | None] = [None] * len(self.arch.layers)
        first_with_params = min(i for i, (a, b) in enumerate(self._param_slices) if b > a)
        for i in range(len(self.arch.layers) - 1, first_with_params - 1, -1):
            result = self.arch.layers[i].backward(
                grad,
                caches[i],
                self._of(values, self._param_slices, i),
                self._state(i, buffers, mirrors),
                scale,
                need_input_grad=i > first_with_params,
                defer=defer,
            )
            results[i] = result
            grad = result.grad_in
        return results

    def _step(
        self, x: Tensor, y: Tensor, scale: Tensor, defer: bool
    ) -> tuple[Tensor, list[Tensor], list[Tensor], list[Backward | None]]:
        values = self._read_weights()
        buffers, mirrors = self._read_state(with_buffers=defer)
        logits, caches = self._forward(x, values, buffers, mirrors)
        loss, dlogits, _ = softmax_cross_entropy(logits, y, self.arch.n_classes)
        return loss, values, buffers, self._backward(dlogits, caches, values, buffers, mirrors, scale, defer)

    @staticmethod
    def _flat_grads(results: list[Backward | None]) -> list[Tensor | None]:
        return [g for r in results if r is not None for g in r.grads]

    # -- signatures ---------------------------------------------------------------
    def _train(self, x: Tensor, y: Tensor, lr: Tensor) -> dict[str, Tensor]:
        loss, values, _, results = self._step(x, y, -lr, defer=False)
        self._assign_weights([value + delta for value, delta in zip(values, self._flat_grads(results), strict=True)])
        return {"loss": loss}

    def _train_deferred(self, x: Tensor, y: Tensor, lr: Tensor, slot: Tensor) -> dict[str, Tensor]:
        from tensorflow.compiler.tf2xla.python import xla

        loss, values, buffers, results = self._step(x, y, -lr, defer=True)
        deltas = self._flat_grads(results)
        self._assign_weights([None if d is None else v + d for v, d in zip(values, deltas, strict=True)])
        zero = tf.constant(0, tf.int32)
        for i, result in enumerate(results):
            if result is None or result.factors is None:
                continue
            start, _ = self._buffer_slices[i]
            u_t, v = result.factors
            pending_out, pending_in = buffers[start], buffers[start + 1]
            self.buffers[start].assign(xla.dynamic_update_slice(pending_out, u_t, tf.stack([zero, slot])))
            self.buffers[start + 1].assign(xla.dynamic_update_slice(pending_in, v, tf.stack([slot, zero])))
        return {"loss": loss}

    def _clear_buffers(self) -> None:
        for buf in self.buffers + self.gradient_sums:
            buf.assign(tf.zeros(buf.shape, tf.float32))

    def _accumulate(self, x: Tensor, y: Tensor, weight: Tensor) -> dict[str, Tensor]:
        loss, _, _, results = self._step(x, y, weight, defer=False)
        for total, grad in zip(self.gradient_sums, self._flat_grads(results), strict=True):
            total.assign(total.read_value() + grad)
        return {"loss": loss}

    def _apply_sums(self, new_values: list[Tensor]) -> dict[str, Tensor]:
        self._assign_weights(new_values)
        for total in self.gradient_sums:
            total.assign(tf.zeros(total.shape, tf.float32))
        return {"n_params": tf.constant(self.n_params, tf.int32)}

    def _apply_accumulated(self, lr: Tensor) -> dict[str, Tensor]:
        values = self._read_weights()
        return self._apply_sums(
            [value - lr * total.read_value() for value, total in zip(values, self.gradient_sums, strict=True)]
        )

    def _apply_accumulated_prox(self, lr: Tensor, mu: Tensor) -> dict[str, Tensor]:
        step, values = lr * mu, self._read_weights()
        return self._apply_sums(
            [
                value - lr * total.read_value() - step * (value - anchor.read_value())
                for value, total, anchor in zip(values, self.gradient_sums, self.anchor, strict=True)
            ]
        )

    def _flush(self) -> dict[str, Tensor]:
        buffers, _ = self._read_state(with_buffers=True)
        self._assign_weights(self._effective(self._read_weights(), buffers))
        self._clear_buffers()
        return {"n_params": tf.constant(self.n_params, tf.int32)}

    def _train_prox(self, x: Tensor, y: Tensor, lr: Tensor, mu: Tensor) -> dict[str, Tensor]:
        loss, values, _, results = self._step(x, y, -lr, defer=False)
        step = lr * mu
        self._assign_weights(
            [
                value + delta - step * (value - anchor.read_value())
                for anchor, value, delta in zip(self.anchor, values, self._flat_grads(results), strict=True)
            ]
        )
        return {"loss": loss}

    def _set_anchor(self) -> dict[str, Tensor]:
        for anchor, value in zip(self.anchor, self._read_weights(), strict=True):
            anchor.assign(value)
        return {"n_params": tf.constant(self.n_params, tf.int32)}

    def _infer(self, x: Tensor) -> dict[str, Tensor]:
        logits, _ = self._forward(x, self._read_weights(), [], [])
        return {"logits": logits}

    def _evaluate(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        logits, _ = self._forward(x, self._read_weights(), [], [])
        loss, _, correct = softmax_cross_entropy(logits, y, self.arch.n_classes)
        return {"loss": loss, "correct": correct}

    def _gradients(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        _, _, _, results = self._step(x, y, tf.constant(1.0), defer=False)
        grads = self._flat_grads(results)
        return {"gradients": tf.concat([tf.reshape(g, [-1]) for g in grads if g is not None], axis=0)}

    def _get_weights(self) -> dict[str, Tensor]:
        return {"weights": tf.concat([tf.reshape(w, [-1]) for w in self._read_weights()], 0)}

    def _set_weights(self, weights: Tensor) -> dict[str, Tensor]:
        offset, values = 0, []
        for spec in self.specs:
            values.append(tf.reshape(weights[offset : offset + spec.size], spec.shape))
            offset += spec.size
        self._assign_weights(values)
        self._clear_buffers()
        return {"n_params": tf.constant(self.n_params, tf.int32)}

    def _get_tensors(self) -> dict[str, Tensor]:
        return {tensor_key(s.name): w for s, w in zip(self.specs, self._read_weights(), strict=True)}

    def _set_tensors(self, *tensors: Tensor) -> dict[str, Tensor]:
        self._assign_weights(list(tensors))
        self._clear_buffers()
        return {"n_params": tf.constant(self.n_params, tf.int32)}

    def signatures(self) -> dict[str, Any]:
        """Concrete functions keyed by signature name, for ``tf.saved_model.save``."""
        names = ["train", "train_prox", "set_anchor", "infer", "evaluate", "gradients", "get_weights", "set_weights"]
        names += ["get_tensors", "set_tensors"]
        if self.deferred_rank:
            names += ["train_deferred", "flush"]
        if self.gradient_sums:
            names += ["accumulate", "apply_accumulated", "apply_accumulated_prox"]
        return {name: getattr(self, name).get_concrete_function() for name in names}


def flat_weights(values: list[np.ndarray]) -> np.ndarray:
    """Concatenate tensors into the flat float32 vector the signatures use."""
    return np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in values])
