"""The same zoo architectures as plain Keras models (the reference the benchmarks
and gradient tests compare against), and conversion of covey's flat weights into
Keras' tensor layouts."""

from __future__ import annotations

from typing import Any

import numpy as np

from models.layers import Conv2D, Dense, Reshape
from models.zoo import Architecture


def keras_model(arch: Architecture) -> Any:
    """A ``keras.Sequential`` computing the same function as ``arch``."""
    import keras

    layers: list[Any] = [keras.Input(arch.input_shape)]
    for layer in arch.layers:
        if isinstance(layer, Dense):
            layers.append(keras.layers.Dense(layer.n_out, activation="relu" if layer.relu else None))
        elif isinstance(layer, Conv2D):
            activation = "relu" if layer.relu else None
            layers.append(keras.layers.Conv2D(layer.c_out, layer.k, padding="same", activation=activation))
            if layer.pool:
                layers.append(keras.layers.MaxPool2D(2))
        elif isinstance(layer, Reshape):
            layers.append(keras.layers.Reshape(layer.out_shape))
        else:  # pragma: no cover - the zoo only uses the layers above
            raise TypeError(f"no Keras equivalent for {type(layer).__name__}")
    return keras.Sequential(layers)


def to_keras_weights(arch: Architecture, flat: np.ndarray) -> list[np.ndarray]:
    """Split covey's flat vector into the weight list ``keras_model(arch)`` expects."""
    out: list[np.ndarray] = []
    offset = 0
    specs = iter(arch.param_specs())
    for layer in arch.layers:
        if not isinstance(layer, (Dense, Conv2D)):
            continue
        kernel_spec, bias_spec = next(specs), next(specs)
        kernel = flat[offset : offset + kernel_spec.size].reshape(kernel_spec.shape)
        offset += kernel_spec.size
        bias = flat[offset : offset + bias_spec.size]
        offset += bias_spec.size
        if isinstance(layer, Dense):
            out.append(kernel.T.copy())  # covey stores [out, in], Keras [in, out]
        else:
            out.append(kernel.reshape(layer.k, layer.k, layer.c_in, layer.c_out).copy())
        out.append(bias.copy())
    return out


def from_keras_weights(arch: Architecture, tensors: list[np.ndarray]) -> np.ndarray:
    """The inverse of :func:`to_keras_weights` (for gradients or trained weights)."""
    parts: list[np.ndarray] = []
    it = iter(tensors)
    for layer in arch.layers:
        if not isinstance(layer, (Dense, Conv2D)):
            continue
        kernel, bias = np.asarray(next(it)), np.asarray(next(it))
        parts.append((kernel.T if isinstance(layer, Dense) else kernel).reshape(-1))
        parts.append(bias.reshape(-1))
    return np.concatenate(parts).astype(np.float32)
