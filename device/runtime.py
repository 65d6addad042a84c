"""Run covey's ``.tflite`` models on a board: train, evaluate, read and write weights.

The interpreter comes from the first of these that imports:

1. ``ai_edge_litert`` (LiteRT, the maintained successor; wheels for CPython 3.10-3.14
   on x86_64 and aarch64),
2. ``tflite_runtime`` (last release 2.14, CPython <= 3.11, needs numpy < 2),
3. ``tensorflow.lite`` where TensorFlow happens to be installed (a development
   machine). It is imported by name only when the first two are missing, so a board
   never needs TensorFlow.

Every model is checked before it is loaded: its manifest must be valid and the
file's sha256 must match. Every input is checked before anything changes: weight
vectors must have the manifest's length and be finite, data must have the model's
input shape and labels in ``[0, n_classes)``.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import logging
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import DataError, ModelError, WeightsError
from device.manifest import Manifest, load_manifest, manifest_path_for, read_verified_model
from device.memory import pin_mmap_threshold
from device.native_log import first_allocation

log = logging.getLogger(__name__)

BACKENDS = ("ai_edge_litert", "tflite_runtime", "tensorflow")
# Evaluation batch: activations grow with it (the FEMNIST CNN holds ~1.3 MB per sample
# of patch matrices); 32 keeps evaluation within a board's memory at a small cost.
EVAL_BATCH = 32


def _can_hold_weights(arr: np.ndarray | None, n: int) -> bool:
    """Whether ``arr`` can take a model of ``n`` weights in place."""
    return (
        isinstance(arr, np.ndarray)
        and arr.dtype == np.float32
        and arr.shape == (n,)
        and arr.flags.writeable
        and arr.flags.c_contiguous
    )


class _PageReleaser:
    """Gives the whole pages of a buffer back to the kernel (``madvise(MADV_DONTNEED)``).

    Every signature keeps its input and output tensors in its own arena for the life
    of the interpreter, and no interpreter wrapper can free an arena. The weight
    signatures' arenas hold a whole model each (26 MB for the FEMNIST CNN) but are
    needed only while weights are copied in or out. After that copy their contents
    are dead: LiteRT never reads a signature's inputs before they are written again,
    nor its outputs after they are read. So the runtime releases those pages. The
    addresses stay mapped: the next write faults in zeroed pages, which LiteRT and
    numpy see as ordinary memory. Only pages that lie wholly inside the tensor are
    released, so no neighbouring allocation is touched. Linux only (glibc, musl and
    Android's bionic alike); elsewhere this does nothing.
    """

    MADV_DONTNEED = 4

    def __init__(self, enabled: bool = True) -> None:
        self._madvise: Any = None
        if enabled and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                madvise = libc.madvise
            except (OSError, AttributeError):  # pragma: no cover - every Linux libc has madvise
                return
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
            self._madvise = madvise

    def release(self, arr: np.ndarray) -> int:
        """Release the pages wholly inside ``arr``'s buffer; returns the bytes released."""
        if self._madvise is None or not arr.flags.c_contiguous:
            return 0
        start = int(arr.__array_interface__["data"][0])
        return self._release_span(start, start + arr.nbytes)

    def _release_span(self, start: int, stop: int) -> int:
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, stop // page * page
        if hi <= lo or self._madvise(lo, hi - lo, self.MADV_DONTNEED) != 0:
            return 0
        return hi - lo

    def copy_out(self, src: np.ndarray, dst: np.ndarray, chunk_bytes: int = 1 << 20) -> None:
        """``dst[...] = src``, releasing ``src``'s pages as they are copied.

        A single copy would hold both whole buffers at its end (two 26 MB kernels for the
        FEMNIST CNN); chunk by chunk, the source shrinks as the destination grows, so the
        copy adds one chunk to the peak. Only pages wholly inside ``src`` are released.
        """
        flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
        if self._madvise is None or not src.flags.c_contiguous:
            flat_dst[...] = flat_src
            return
        base = int(src.__array_interface__["data"][0])
        step = max(1, chunk_bytes // max(src.itemsize, 1))
        released = base  # pages below this address are gone (or were never ours)
        for first in range(0, flat_src.size, step):
            last = min(first + step, flat_src.size)
            flat_dst[first:last] = flat_src[first:last]
            stop = base + last * src.itemsize
            self._release_span(released, stop)
            released = max(released, stop // mmap.PAGESIZE * mmap.PAGESIZE)


_pages = _PageReleaser()
_keep_pages = _PageReleaser(enabled=False)  # copies only: for interpreters that load a model per task


def _all_finite(arr: np.ndarray) -> bool:
    """Whether every element is finite, without ``isfinite``'s boolean copy of the array
    (6.6 MB for the FEMNIST CNN's weights, allocated while both weight vectors are
    alive). The minimum and the maximum are NaN if any element is (both reductions
    propagate NaN), and one of them is infinite if an element is. The two vectorised
    reductions are faster than the float64 sum this used before, which went through a
    casting loop. A training task runs it three times: on the start weights, the
    features and the result."""
    if arr.size == 0:
        return True
    return bool(np.isfinite(arr.min()) and np.isfinite(arr.max()))


def tensor_key(name: str) -> str:
    """A manifest tensor's input/output name in ``get_tensors``/``set_tensors``
    (``models.trainable`` names the signatures' tensors with this function)."""
    return name.replace("/", "_")


@dataclass(frozen=True)
class Backend:
    """An importable interpreter implementation."""

    name: str
    interpreter_class: Any
    version: str


def _load_backend(name: str) -> Backend:
    if name == "ai_edge_litert":
        module = importlib.import_module("ai_edge_litert.interpreter")
        root = importlib.import_module("ai_edge_litert")
        return Backend(name, module.Interpreter, getattr(root, "__version__", "?"))
    if name == "tflite_runtime":
        module = importlib.import_module("tflite_runtime.interpreter")
        root = importlib.import_module("tflite_runtime")
        return Backend(name, module.Interpreter, getattr(root, "__version__", "?"))
    if name == "tensorflow":
        tf = importlib.import_module("tensorflow")
        return Backend(name, tf.lite.Interpreter, tf.__version__)
    raise ModelError(f"unknown interpreter backend {name!r}; choose one of {', '.join(BACKENDS)}")


def find_backend(preferred: str | None = None) -> Backend:
    """Return the first interpreter backend that imports.

    ``preferred`` (or the ``COVEY_TFLITE_BACKEND`` environment variable) forces one.
    """
    preferred = preferred or os.environ.get("COVEY_TFLITE_BACKEND") or None
    candidates = (preferred,) if preferred else BACKENDS
    errors = []
    for name in candidates:
        try:
            return _load_backend(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ModelError(
        "no TFLite interpreter is installed (" + "; ".join(errors) + "). "
        "Install one: `pip install ai-edge-litert` (or tflite-runtime on Python <= 3.11)"
    )


@dataclass(frozen=True)
class TrainResult:
    """What local training returns: new weights, samples seen per epoch, mean loss."""

    weights: np.ndarray
    n_samples: int
    mean_loss: float
    n_steps: int


@dataclass(frozen=True)
class EvalResult:
    """Loss and accuracy of the current weights on a data set."""

    loss: float
    accuracy: float
    n_samples: int
    n_correct: int


@dataclass(frozen=True)
class _TensorIO:
    """A signature's input and output tensors as numpy views of the interpreter's buffers."""

    wrapper: Any
    subgraph: int
    inputs: dict[str, int]
    outputs: dict[str, int]

    def allocate(self) -> None:
        first_allocation(self.wrapper.AllocateTensors, self.subgraph)

    def invoke(self) -> None:
        first_allocation(self.wrapper.AllocateTensors, self.subgraph)
        self.wrapper.Invoke(self.subgraph)

    def input(self, key: str) -> np.ndarray:
        view: np.ndarray = self.wrapper.tensor(self.wrapper, self.inputs[key], self.subgraph)
        return view

    def output(self, key: str) -> np.ndarray:
        view: np.ndarray = self.wrapper.tensor(self.wrapper, self.outputs[key], self.subgraph)
        return view


class _SignatureCall:
    """A signature runner's call, for the inputs the runtime itself builds.

    It does what ``SignatureRunner.__call__`` does (set every input, allocate, invoke,
    read every output), with one difference that matters on ARM: an input is resized
    only when its value's shape differs from the tensor's current shape, and a 0-d
    (scalar) input is never resized. ``SignatureRunner`` resizes every input on every
    call, and LiteRT's ``InterpreterWrapper::ResizeInputTensor`` given the empty dims
    of a scalar (the ``lr`` of every ``train`` signature) segfaults in ``memset`` on
    arm64 (seen with ai-edge-litert 1.4.0 and 2.3.0 under qemu-user; issue 25), so the
    default board backend could not take one train step. Resizing to an unchanged shape
    is a no-op inside TFLite (``Subgraph::ResizeInputTensor`` returns early), so
    skipping it changes nothing on any backend. It also saves time: without the
    runner's per-call checks, less of each call runs around ``Invoke``, and that time
    holds the GIL, which the simulator's worker threads share.
    """

    def __init__(
        self,
        wrapper: Any,
        subgraph: int,
        inputs: dict[str, int],
        outputs: list[tuple[str, int]],
        shapes: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.wrapper, self.subgraph, self.inputs, self.outputs = wrapper, subgraph, inputs, outputs
        # the shape each input tensor has now; an input not listed is resized on first use
        self.shapes: dict[str, tuple[int, ...]] = dict(shapes or {})
        self._dims: dict[tuple[int, ...], np.ndarray] = {}

    @classmethod
    def of(cls, runner: Any) -> _SignatureCall | None:
        """For a LiteRT, tflite_runtime or TensorFlow signature runner; None for anything else."""
        wrapper = getattr(runner, "_interpreter_wrapper", None)
        subgraph = getattr(runner, "_subgraph_index", None)
        inputs, outputs = getattr(runner, "_inputs", None), getattr(runner, "_outputs", None)
        calls = ("ResizeInputTensor", "AllocateTensors", "SetTensor", "Invoke", "GetTensor")
        if wrapper is None or subgraph is None or inputs is None or outputs is None:
            return None
        if not all(hasattr(wrapper, c) for c in calls):
            return None
        return cls(wrapper, subgraph, dict(inputs), list(outputs), _input_shapes(runner))

    def resize(self, name: str, shape: tuple[int, ...]) -> None:
        """Give input ``name`` the shape ``shape`` unless it has it already.

        A scalar input keeps its shape: a scalar value needs no resize, and a value of
        another rank for it is a bug in this module (refused, never passed to LiteRT).
        """
        current = self.shapes.get(name)
        if current == shape:
            return
        if current == () or shape == ():
            raise ModelError(f"input {name!r} has shape {current}; a value of shape {shape} cannot be set")
        dims = self._dims.get(shape)
        if dims is None:
            dims = self._dims[shape] = np.array(shape, np.int32)
        self.wrapper.ResizeInputTensor(self.inputs[name], dims, False, self.subgraph)
        self.shapes[name] = shape

    def __call__(self, **values: np.ndarray) -> dict[str, np.ndarray]:
        wrapper, subgraph, inputs = self.wrapper, self.subgraph, self.inputs
        if values.keys() != inputs.keys():
            raise ModelError(f"signature inputs are {sorted(inputs)}, got {sorted(values)}")  # a bug in this module
        for name, value in values.items():
            if self.shapes.get(name) != value.shape:
                self.resize(name, value.shape)
        first_allocation(wrapper.AllocateTensors, subgraph)
        for name, value in values.items():
            wrapper.SetTensor(inputs[name], value, subgraph)
        wrapper.Invoke(subgraph)
        return {name: wrapper.GetTensor(index, subgraph) for name, index in self.outputs}


def _input_shapes(runner: Any) -> dict[str, tuple[int, ...]]:
    """The current shape of each of a signature runner's inputs (empty where the runner
    cannot say: every input is then resized once, on its first use)."""
    try:
        details = runner.get_input_details()
        return {name: tuple(int(d) for d in info["shape"]) for name, info in details.items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}


class TFLiteModel:
    """A covey ``.tflite`` model in an interpreter, with checked inputs.

    Parameters
    ----------
    model_path:
        The ``.tflite`` file. Its manifest is ``model_path.with_suffix('.json')``
        unless ``manifest`` is given.
    manifest:
        An already validated manifest (e.g. received over the network).
    num_threads:
        Interpreter threads; default: all CPUs this process may use.
    backend:
        Force ``ai_edge_litert``, ``tflite_runtime`` or ``tensorflow``.
    release_memory:
        Give memory back to the system as soon as it is dead, as a board needs: fix
        glibc's mmap threshold for the process (``device.memory``), so a dropped model
        is unmapped at once, and release the pages of the weight signatures' buffers
        after each copy (``_PageReleaser``); a board's peak is a model or two lower.
        The simulator's interpreters, which load a model for every virtual device's
        task, pass ``False``: every model-sized array would be fresh pages that fault
        in, and every load would fault the released buffers back in, a cost in every
        simulated client's task. The weights and results are the same either way.
    """

    def __init__(
        self,
        model_path: Path | str,
        manifest: Manifest | None = None,
        *,
        num_threads: int | None = None,
        backend: str | None = None,
        release_memory: bool = True,
    ) -> None:
        if release_memory:
            pin_mmap_threshold()  # a dropped model's pages go back to the system (device/memory.py)
        model_path = Path(model_path)
        self.manifest = manifest or load_manifest(manifest_path_for(model_path))
        model_bytes = read_verified_model(model_path, self.manifest)
        self.backend = find_backend(backend)
        threads = num_threads or len(os.sched_getaffinity(0))
        try:
            self._interpreter = self.backend.interpreter_class(model_content=model_bytes, num_threads=threads)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"{self.backend.name} cannot load {model_path}: {exc}") from None
        available = set(self._interpreter.get_signature_list())
        missing = [s for s in self.manifest.signatures if s not in available]
        if missing:
            raise ModelError(f"{model_path} lacks the signatures its manifest lists: {missing}")
        self._runners: dict[str, Any] = {}
        self._primed: set[str] = set()  # signatures whose tensors _prime_arena allocated
        self._pending_rows = 0  # rows of deferred updates not yet folded in
        self._weights_set = self.manifest.initial_weights
        self.path = model_path
        self.num_threads = threads
        self._pages = _pages if release_memory else _keep_pages
        log.info(
            "loaded %s (%d parameters) with %s %s, %d threads",
            self.manifest.model,
            self.manifest.n_params,
            self.backend.name,
            self.backend.version,
            threads,
        )

    # -- signature plumbing ---------------------------------------------------------
    def _runner(self, name: str) -> Callable[..., dict[str, np.ndarray]]:
        if name not in self._runners:
            if name not in self.manifest.signatures:
                raise ModelError(f"model {self.manifest.model} has no {name!r} signature")
            plain = self._interpreter.get_signature_runner(name)
            self._runners[name] = _SignatureCall.of(plain) or plain
        runner: Callable[..., dict[str, np.ndarray]] = self._runners[name]
        return runner

    @property
    def n_params(self) -> int:
        return self.manifest.n_params

    # -- weights ----------------------------------------------------------------------
    def _require_weights(self) -> None:
        if not self._weights_set:
            raise ModelError(
                f"{self.manifest.model}: this model file carries no initial weights (a device artifact); "
                "call set_weights (or train with initial_weights) before reading, training or evaluating"
            )

    def get_weights(self, out: np.ndarray | None = None) -> np.ndarray:
        """All trainable tensors as one flat float32 vector (written into ``out`` when
        given: a writable, contiguous float32 vector of the model's length).

        Models with a ``get_tensors`` signature are read tensor by tensor straight
        into the flat vector: ``get_weights`` would hold a second, concatenated copy
        of every weight in its own arena for the rest of the process (26 MB for the
        FEMNIST CNN), and its output would be copied once more into Python. The
        pages of ``get_tensors``' outputs are released chunk by chunk as they are
        copied (see ``_PageReleaser.copy_out``), so reading adds the flat vector and
        one chunk to the peak, not a second copy of the model.
        """
        self._require_weights()
        if out is not None and not _can_hold_weights(out, self.n_params):
            raise ValueError(f"out must be a writable, contiguous float32 vector of {self.n_params} values")
        if "get_tensors" not in self.manifest.signatures:
            weights = np.asarray(self._runner("get_weights")()["weights"], dtype=np.float32).reshape(-1)
            if out is None:
                return weights
            out[...] = weights
            return out
        flat = np.empty(self.n_params, np.float32) if out is None else out
        io = self._tensor_io("get_tensors")
        if io is None:  # a runner without view access: its outputs are copies
            copies = self._runner("get_tensors")()
            for t in self.manifest.tensors:
                flat[t.offset : t.offset + t.size] = copies[tensor_key(t.name)].reshape(-1)
            return flat
        io.invoke()
        for t in self.manifest.tensors:
            self._pages.copy_out(io.output(tensor_key(t.name)), flat[t.offset : t.offset + t.size])
        return flat

    def _tensor_io(self, name: str) -> _TensorIO | None:
        """Direct access to signature ``name``'s input and output buffers, or None where
        the interpreter offers no views (the ``tensor`` view every backend's wrapper
        has; a view is valid until the next call of any signature)."""
        runner = self._runner(name)
        if not isinstance(runner, _SignatureCall):
            return None
        wrapper, subgraph, inputs, outputs = runner.wrapper, runner.subgraph, runner.inputs, dict(runner.outputs)
        if wrapper is None or subgraph is None or not (inputs or outputs) or not hasattr(wrapper, "tensor"):
            return None
        return _TensorIO(wrapper, subgraph, inputs, outputs)

    def check_weights(self, weights: np.ndarray) -> np.ndarray:
        """Validate a flat weight vector against the manifest; return it as float32."""
        arr = np.asarray(weights)
        if arr.ndim != 1 or arr.shape[0] != self.n_params:
            raise WeightsError(
                f"weight vector has shape {arr.shape}; model {self.manifest.model} needs ({self.n_params},)"
            )
        if arr.dtype != np.float32:
            if not np.issubdtype(arr.dtype, np.floating):
                raise WeightsError(f"weight vector has dtype {arr.dtype}; float32 expected")
            arr = arr.astype(np.float32)
        if not _all_finite(arr):
            bad = int(np.count_nonzero(~np.isfinite(arr)))
            raise WeightsError(f"weight vector holds {bad} NaN or infinite values; refusing to load it")
        return arr

    def set_weights(self, weights: np.ndarray) -> None:
        """Load a flat weight vector; nothing changes if it is refused."""
        arr = self.check_weights(weights)
        if "set_tensors" in self.manifest.signatures:
            # One input per tensor: set_weights would also hold sliced copies of every
            # weight in its arena. set_tensors also clears pending deferred updates.
            layout = self.manifest.tensors
            io = self._tensor_io("set_tensors")
            if io is None:
                self._runner("set_tensors")(
                    **{tensor_key(t.name): arr[t.offset : t.offset + t.size].reshape(t.shape) for t in layout}
                )
            else:
                io.allocate()
                for t in layout:
                    io.input(tensor_key(t.name))[...] = arr[t.offset : t.offset + t.size].reshape(t.shape)
                io.invoke()
                for t in layout:  # the variables hold the weights now; the inputs are dead
                    self._pages.release(io.input(tensor_key(t.name)))
        else:
            self._runner("set_weights")(weights=arr)
        self._pending_rows = 0
        self._weights_set = True

    def weights_by_tensor(self, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Split a flat vector into named tensors (views) using the manifest layout."""
        flat = self.get_weights() if weights is None else self.check_weights(weights)
        return {t.name: flat[t.offset : t.offset + t.size].reshape(t.shape) for t in self.manifest.tensors}

    # -- data checks ------------------------------------------------------------------
    def check_data(self, x: np.ndarray, y: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Validate features (and labels) against the model; return float32/int32 arrays."""
        x = np.asarray(x)
        want = self.manifest.input_shape
        if x.ndim == 2 and x.shape[1:] != want and x.shape[1] == int(np.prod(want)):
            x = x.reshape((x.shape[0], *want))  # flat rows for an image model
        if x.shape[1:] != want:
            raise DataError(f"data has samples of shape {x.shape[1:]}; model {self.manifest.model} takes {want}")
        if x.shape[0] == 0:
            raise DataError("data set is empty")
        if not np.issubdtype(x.dtype, np.number):
            raise DataError(f"features have dtype {x.dtype}; numbers expected")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not _all_finite(x):
            raise DataError("features hold NaN or infinite values")
        if y is None:
            return x, None
        y = np.asarray(y)
        if y.shape != (x.shape[0],):
            raise DataError(f"{x.shape[0]} samples but labels have shape {y.shape}")
        if not np.issubdtype(y.dtype, np.integer):
            if np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
                y = y.astype(np.int64)
            else:
                raise DataError(f"labels have dtype {y.dtype}; integer class ids expected")
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= self.manifest.n_classes:
            raise DataError(
                f"labels range over [{lo}, {hi}] but model {self.manifest.model} has "
                f"{self.manifest.n_classes} classes (0..{self.manifest.n_classes - 1})"
            )
        return x, np.ascontiguousarray(y, dtype=np.int32)

    # -- training and evaluation -------------------------------------------------------
    def _batches(self, n: int, batch_size: int, rng: np.random.Generator | None) -> Iterator[np.ndarray]:
        order = rng.permutation(n) if rng is not None else np.arange(n)
        for start in range(0, n, batch_size):
            yield order[start : start + batch_size]

    def _flush(self) -> None:
        self._runner("flush")()
        self._pending_rows = 0

    def _accumulating_step(self, lr: float, mu: float) -> Callable[[np.ndarray, np.ndarray], float]:
        """One SGD (or FedProx) step per batch, its gradient summed over chunks.

        A batch of ``n`` splits into ``ceil(n / chunk)`` near-equal chunks; chunk ``c``
        adds ``n_c / n`` times its mean-loss gradient, so the applied gradient is the
        batch's mean gradient and the step is the one ``train``/``train_prox`` take.
        """
        accumulate, chunk = self._runner("accumulate"), self.manifest.accumulate_chunk
        # the SGD step never reads the FedProx anchor (a device artifact has none before set_anchor)
        apply_name, apply_args = "apply_accumulated", {"lr": np.float32(lr)}
        if mu > 0:
            apply_name, apply_args = "apply_accumulated_prox", {**apply_args, "mu": np.float32(mu)}
        apply = self._runner(apply_name)

        def accumulating_step(xb: np.ndarray, yb: np.ndarray) -> float:
            n = len(xb)
            n_chunks = -(-n // chunk)
            bounds = [n * i // n_chunks for i in range(n_chunks + 1)]
            loss = 0.0
            for start, stop in itertools.pairwise(bounds):
                weight = np.float32((stop - start) / n)
                out = accumulate(x=xb[start:stop], y=yb[start:stop], weight=weight)
                loss += float(weight) * float(out["loss"])
            apply(**apply_args)
            return loss

        return accumulating_step

    def _prime_arena(self, name: str) -> None:
        """Allocate signature ``name``'s tensors before any training step runs.

        LiteRT gives all signatures one shared arena for their intermediate tensors
        and grows it, when a signature needs more, by allocating the larger arena
        before freeing the old one: for a moment both are resident. The fold-in
        signatures (``flush``, ``apply_accumulated``) have fixed shapes and the
        largest arenas (the FEMNIST CNN's ``flush``: 51 MB, about what
        ``train_deferred`` takes at batch 32). Allocating the fold-in first, while
        the arena is still small, spares the 49 MB transient of growing it from the
        step's size in the middle of training. Allocation computes nothing, so the
        weights are unaffected.
        """
        if name in self._primed or name not in self.manifest.signatures:
            return
        io = self._tensor_io(name)
        if io is not None:
            io.allocate()
        self._primed.add(name)

    def _step_function(
        self, lr: float, mu: float, batch_size: int, deferred: bool = True, accumulate: bool = True
    ) -> Callable[[np.ndarray, np.ndarray], float]:
        """The per-batch step: accumulated over chunks, FedProx, deferred-update SGD or plain SGD."""
        lr32 = np.float32(lr)
        if mu > 0:
            self._runner("set_anchor")()
        chunk = self.manifest.accumulate_chunk
        if accumulate and chunk and batch_size > chunk:
            self._prime_arena("apply_accumulated_prox" if mu > 0 else "apply_accumulated")
            return self._accumulating_step(lr, mu)
        if mu > 0:
            prox, mu32 = self._runner("train_prox"), np.float32(mu)
            return lambda xb, yb: float(prox(x=xb, y=yb, lr=lr32, mu=mu32)["loss"])
        rank = self.manifest.deferred_rank
        # At least two steps per fold-in: with one, a deferred step does a plain step's
        # work and the factors' besides, and is slower (docs/models.md, "Deferred updates").
        if deferred and rank and 2 * batch_size <= rank:
            self._prime_arena("flush")
            train_deferred = self._runner("train_deferred")

            def deferred_step(xb: np.ndarray, yb: np.ndarray) -> float:
                # Fold pending rows into the kernel before they run out (layers.Dense).
                if self._pending_rows + len(xb) > rank:
                    self._flush()
                loss = float(train_deferred(x=xb, y=yb, lr=lr32, slot=np.int32(self._pending_rows))["loss"])
                self._pending_rows += len(xb)
                return loss

            return deferred_step
        plain = self._runner("train")
        return lambda xb, yb: float(plain(x=xb, y=yb, lr=lr32)["loss"])

    def train(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        epochs: int = 1,
        batch_size: int = 10,
        lr: float = 0.01,
        mu: float = 0.0,
        max_steps: int | None = None,
        seed: int | np.random.Generator | None = 0,
        initial_weights: np.ndarray | None = None,
        deferred: bool = True,
        accumulate: bool = True,
        reuse_start: bool = False,
    ) -> TrainResult:
        """Run ``epochs`` epochs of mini-batch SGD and return the new weights.

        ``reuse_start``: the caller gives ``initial_weights`` up, and the trained
        weights are written into its buffer (when it is a writable, contiguous float32
        vector) instead of a new one: one model less at the end of training, the peak
        of a device's memory (26 MB for the FEMNIST CNN; docs/results.md). Ignored
        when the buffer cannot hold them.

        Batches are drawn from a permutation made by a seeded generator; the last,
        partial batch of each epoch is included. With ``mu > 0`` each step adds the
        FedProx proximal term anchored at the weights training starts from.
        ``max_steps`` stops early (cold-start pre-training uses a fixed step count).
        Models with a deferred-update layer use ``train_deferred`` (same SGD, faster;
        see ``models/layers.py``) when two batches fit its pending rows, unless
        ``deferred=False``. Models with
        ``accumulate_chunk`` train batches larger than it as one step whose gradient
        is summed over chunks (same SGD, faster; see ``models/trainable.py``) unless
        ``accumulate=False``.
        """
        if epochs < 1 or batch_size < 1 or not np.isfinite(lr) or lr <= 0 or mu < 0:
            raise DataError(f"invalid training settings epochs={epochs} batch_size={batch_size} lr={lr} mu={mu}")
        x, y_checked = self.check_data(x, y)
        assert y_checked is not None
        if initial_weights is not None:
            self.set_weights(initial_weights)
        into = initial_weights if reuse_start and _can_hold_weights(initial_weights, self.n_params) else None
        self._require_weights()
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        step = self._step_function(lr, mu, batch_size, deferred, accumulate)
        total_loss, total_seen, steps = 0.0, 0, 0
        try:
            for _ in range(epochs):
                for idx in self._batches(x.shape[0], batch_size, rng):
                    loss = step(x[idx], y_checked[idx])
                    total_loss += loss * len(idx)
                    total_seen += len(idx)
                    steps += 1
                    if max_steps is not None and steps >= max_steps:
                        break
                if max_steps is not None and steps >= max_steps:
                    break
        finally:
            if self._pending_rows:
                self._flush()
        if into is not None:  # the start's values are dead: its pages go before the weights are read
            self._pages.release(into)  # (reading faults in a model's worth of output pages first)
        weights = self.get_weights(out=into)
        if not _all_finite(weights):
            raise WeightsError("training diverged: weights became NaN or infinite; lower the learning rate")
        return TrainResult(weights, int(x.shape[0]), total_loss / max(total_seen, 1), steps)

    def evaluate(self, x: np.ndarray, y: np.ndarray, *, batch_size: int = EVAL_BATCH) -> EvalResult:
        """Mean loss and accuracy of the current weights."""
        x, y_checked = self.check_data(x, y)
        assert y_checked is not None
        self._require_weights()
        runner = self._runner("evaluate")
        total_loss, correct = 0.0, 0
        for idx in self._batches(x.shape[0], batch_size, None):
            out = runner(x=x[idx], y=y_checked[idx])
            total_loss += float(out["loss"]) * len(idx)
            correct += round(float(out["correct"]))
        n = int(x.shape[0])
        return EvalResult(total_loss / n, correct / n, n, correct)

    def predict_logits(self, x: np.ndarray, *, batch_size: int = EVAL_BATCH) -> np.ndarray:
        x, _ = self.check_data(x)
        self._require_weights()
        runner = self._runner("infer")
        return np.concatenate([runner(x=x[idx])["logits"] for idx in self._batches(x.shape[0], batch_size, None)])

    def gradients(self, x: np.ndarray, y: np.ndarray, *, batch_size: int = EVAL_BATCH) -> np.ndarray:
        """Flat gradient of the mean loss over ``(x, y)`` at the current weights."""
        x, y_checked = self.check_data(x, y)
        assert y_checked is not None
        self._require_weights()
        runner = self._runner("gradients")
        total = np.zeros(self.n_params, np.float64)
        for idx in self._batches(x.shape[0], batch_size, None):
            total += runner(x=x[idx], y=y_checked[idx])["gradients"] * len(idx)
        return (total / x.shape[0]).astype(np.float32)
