"""The covey model zoo: the architectures the five papers train, by stable name.

Parameter counts match ``shared/notes/reference-implementations.md`` ("Models used in
the papers"). One deliberate difference: the FlexCFL MNIST CNN has a dropout layer
that the public code never activates (its Keras model is trained without
``training=True``); covey's CNN omits it, so the trained function is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from models.layers import Conv2D, Dense, Layer, ParamSpec, Reshape


@dataclass(frozen=True)
class Architecture:
    """A sequential architecture: name, input shape, classes, layers."""

    name: str
    description: str
    input_shape: tuple[int, ...]
    n_classes: int
    layers: tuple[Layer, ...] = field(repr=False)
    # Batches larger than this train as one SGD step whose gradient is summed over
    # chunks of at most this many samples (0: never). Set where a chunk's tensors stay
    # in cache and a whole batch's do not (see TrainableModel.accumulate).
    accumulate_chunk: int = 0

    def param_specs(self) -> list[ParamSpec]:
        specs: list[ParamSpec] = []
        for i, layer in enumerate(self.layers):
            specs.extend(layer.params(f"layer{i}_{type(layer).__name__.lower()}"))
        return specs

    @property
    def n_params(self) -> int:
        return sum(spec.size for spec in self.param_specs())

    def initial_weights(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [spec.initial_value(rng) for spec in self.param_specs()]


def _mclr(name: str, n_in: int, n_classes: int, what: str) -> Architecture:
    return Architecture(
        name,
        f"multinomial logistic regression {n_in}->{n_classes} ({what})",
        (n_in,),
        n_classes,
        (Dense(n_in, n_classes, relu=False),),
    )


def _mlp(name: str, hidden: int, n_classes: int, what: str, deferred_rank: int = 0) -> Architecture:
    return Architecture(
        name,
        f"MLP 784-{hidden}-{n_classes} ({what})",
        (784,),
        n_classes,
        (Dense(784, hidden, relu=True, deferred_rank=deferred_rank), Dense(hidden, n_classes, relu=False)),
    )


# Pending-update rows of the FEMNIST MLP's 784x512 layer: at batch 10 (FedAvg's default)
# a plain step spends much of its time adding the update to the 1.6 MB kernel and writing
# it back, which deferred steps do once per fold-in; 40 is in the middle of the 20-60 rows
# that trained about as fast (docs/models.md, "Deferred updates").
MLP_DEFERRED_RANK = 40


# Pending-update rows of the FEMNIST CNN's 3136x2048 layer (see layers.Dense): 128 rows
# hold 25 steps of batch 5 or 4 of batch 32 before one fold-in; the per-step cost of
# the factors stays below 2 % of the layer's own products.
DEFERRED_RANK = 128


# The MNIST CNN's per-sample training rate drops by a tenth from batch 16 to 32 (its
# 14x14x288 patch matrix no longer fits the caches): batches above 16 accumulate the
# gradient over chunks of at most 16 (docs/models.md, "Gradient accumulation").
MNIST_CNN_CHUNK = 16


def _cnn(name: str, k: int, dense: int | None, n_classes: int, what: str, chunk: int = 0) -> Architecture:
    head: tuple[Layer, ...]
    if dense is None:
        head = (Reshape((7, 7, 64), (3136,)), Dense(3136, n_classes, relu=False))
        shape = f"conv{k}x{k}·32 → pool → conv{k}x{k}·64 → pool → dense {n_classes}"
    else:
        head = (
            Reshape((7, 7, 64), (3136,)),
            Dense(3136, dense, relu=True, deferred_rank=DEFERRED_RANK, mirror=True),
            Dense(dense, n_classes, relu=False),
        )
        shape = f"conv{k}x{k}·32 → pool → conv{k}x{k}·64 → pool → dense {dense} → dense {n_classes}"
    return Architecture(
        name,
        f"CNN {shape} ({what})",
        (784,),
        n_classes,
        (
            Reshape((784,), (28, 28, 1)),
            Conv2D(28, 28, 1, 32, k, relu=True, pool=True),  # conv(+b, ReLU) -> 2x2 max-pool
            Conv2D(14, 14, 32, 64, k, relu=True, pool=True),
            *head,
        ),
        accumulate_chunk=chunk,
    )


ZOO: dict[str, Architecture] = {
    a.name: a
    for a in (
        _mclr("mclr_synthetic", 60, 10, "Synthetic(α, β)"),
        _mclr("mclr_mnist", 784, 10, "MNIST"),
        _mclr("mclr_femnist", 784, 62, "FEMNIST"),
        _mlp("mlp_mnist", 128, 10, "MNIST"),
        _mlp("mlp_femnist", 512, 62, "FEMNIST", deferred_rank=MLP_DEFERRED_RANK),
        _cnn("cnn_femnist", 5, 2048, 62, "LEAF / FedGSP FEMNIST"),
        _cnn("cnn_mnist", 3, None, 10, "FlexCFL MNIST", chunk=MNIST_CNN_CHUNK),
    )
}


def get_architecture(name: str) -> Architecture:
    """Look up a zoo model by name, with a clear error listing the known names."""
    try:
        return ZOO[name]
    except KeyError:
        known = ", ".join(sorted(ZOO))
        raise KeyError(f"unknown model {name!r}; the zoo has: {known}") from None
