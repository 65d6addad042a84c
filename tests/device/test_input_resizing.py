"""Input resizing: never a scalar, never to an unchanged shape (issue 25).

LiteRT's ``ResizeInputTensor`` given a scalar's empty dims segfaults on arm64, so the
default board backend crashed at the first train step. These tests record every resize
the runtime asks of the interpreter on x86, where the call itself does not crash; the
emulated-board tests (tests/boards) are the proof on ARM.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from device.errors import ModelError
from device.runtime import TFLiteModel, _SignatureCall


class _RecordingWrapper:
    """An interpreter wrapper that records ``ResizeInputTensor`` calls and forwards all."""

    def __init__(self, real: Any, calls: list[tuple[tuple[int, int], tuple[int, ...]]]) -> None:
        self._real, self._calls = real, calls

    def ResizeInputTensor(self, index: int, dims: np.ndarray, strict: bool, subgraph: int) -> Any:  # noqa: N802
        self._calls.append(((subgraph, index), tuple(int(d) for d in dims)))
        return self._real.ResizeInputTensor(index, dims, strict, subgraph)

    def tensor(self, _wrapper: Any, index: int, subgraph: int) -> Any:
        return self._real.tensor(self._real, index, subgraph)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


Resize = tuple[tuple[int, int], tuple[int, ...]]  # ((subgraph, tensor index), dims)


def _recording(model: TFLiteModel) -> list[Resize]:
    """Make every signature runner of ``model`` record its resizes; returns the record."""
    calls: list[Resize] = []
    interpreter = model._interpreter
    real_runner = interpreter.get_signature_runner

    def runner(name: str) -> Any:
        plain = real_runner(name)
        plain._interpreter_wrapper = _RecordingWrapper(plain._interpreter_wrapper, calls)
        return plain

    interpreter.get_signature_runner = runner
    return calls


def _scalar_inputs(model: TFLiteModel) -> set[tuple[int, int]]:
    """(subgraph, tensor index) of every 0-d input of every signature."""
    scalars: set[tuple[int, int]] = set()
    for name in model.manifest.signatures:
        runner = model._interpreter.get_signature_runner(name)
        for info in runner.get_input_details().values():
            if len(info["shape"]) == 0:
                scalars.add((runner._subgraph_index, int(info["index"])))
    return scalars


@pytest.mark.parametrize("name", ["mlp_femnist", "mclr_synthetic", "cnn_mnist"])
def test_training_evaluating_and_weights_never_resize_a_scalar_input(zoo_model, name: str) -> None:
    # Prepare: a model whose signatures' resizes are recorded
    model = TFLiteModel(zoo_model(name))
    scalars = _scalar_inputs(model)
    calls = _recording(model)
    rng = np.random.default_rng(0)
    x = rng.random((25, *model.manifest.input_shape), dtype=np.float32)
    y = rng.integers(0, model.manifest.n_classes, 25).astype(np.int32)

    # Execute: what an agent does in a round (set, train with a partial last batch, read, evaluate)
    model.set_weights(model.get_weights())
    model.train(x, y, epochs=1, batch_size=10, lr=0.01, seed=1)
    if "train_prox" in model.manifest.signatures:
        model.train(x, y, epochs=1, batch_size=10, lr=0.01, seed=1, mu=0.01)
    model.evaluate(x, y)

    # Assert: the model has scalar inputs (lr, mu), and none was ever resized
    assert scalars, f"{name} has no scalar input to check"
    assert calls, "no resize was recorded at all: the recorder is not in the runtime's path"
    assert not [c for c in calls if c[0] in scalars or c[1] == ()]


def test_an_input_is_resized_only_when_its_shape_changes(zoo_model) -> None:
    # Prepare
    model = TFLiteModel(zoo_model("mlp_femnist"))
    calls = _recording(model)
    rng = np.random.default_rng(0)
    x = rng.random((40, *model.manifest.input_shape), dtype=np.float32)
    y = rng.integers(0, model.manifest.n_classes, 40).astype(np.int32)
    model.train(x[:20], y[:20], epochs=1, batch_size=10, lr=0.01, seed=1)
    after_first = len(calls)

    # Execute: the same batch size again, then a new one
    model.train(x[:20], y[:20], epochs=1, batch_size=10, lr=0.01, seed=1)
    same = len(calls)
    model.train(x, y, epochs=1, batch_size=8, lr=0.01, seed=1)

    # Assert: the same shapes cost no resize; a new batch size one per batched input
    assert same == after_first
    assert {dims for _, dims in calls[same:]} <= {(8, *model.manifest.input_shape), (8,)}
    assert len(calls) > same


def test_a_value_of_another_rank_for_a_scalar_input_is_refused_before_the_interpreter_sees_it() -> None:
    # Prepare: a call over a fake wrapper that fails the test if it is ever asked to resize
    class NoResize:
        def ResizeInputTensor(self, *args: Any) -> None:  # noqa: N802 (the wrapper's name)
            raise AssertionError("resized")

    call = _SignatureCall(NoResize(), 0, {"lr": 3}, [], shapes={"lr": ()})

    # Execute / Assert
    with pytest.raises(ModelError, match="'lr' has shape"):
        call.resize("lr", (1,))
    call.resize("lr", ())  # unchanged: nothing to do
