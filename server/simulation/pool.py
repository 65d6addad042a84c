"""Work units on worker processes: batched per worker, weights through shared memory.

Sending each work unit to a pool on its own costs more than the unit: a FEMNIST MLP
client trains in a few milliseconds (docs/results.md, "Simulation speed"), while
pickling its 1.7 MB start model into a pipe, and its 1.7 MB result back, takes a few
milliseconds each way, for every client. So :class:`SharedPool` (i) packs one map's
calls into one task per worker, balanced by an estimated cost (longest first onto the
least-loaded worker), and (ii) passes every large array through two shared-memory
blocks instead of the pipes: the parent writes each distinct input array once into the
input block (ten clients starting from the same model read the same bytes), and each
call's large results are written by the worker into that call's slot of the output
block, which the parent copies out.
The pipes carry only names, offsets and small values.

Work units are pure functions of their inputs, so the results do not depend on how
calls are batched or how many workers run them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

SHARE_MIN_BYTES = 1 << 15  # smaller arrays travel in the pipe with the rest
ALIGN = 64


@dataclass(frozen=True)
class _Ref:
    """An array in a shared-memory block: ``block`` is "in" or "out"."""

    block: str
    offset: int
    shape: tuple[int, ...]
    dtype: str


def _swap(obj: Any, kind: type, fn: Callable[[Any], Any]) -> Any:
    """``obj`` with every ``kind`` inside it (tuples, lists, dicts, dataclasses) as
    ``fn(item)``; containers holding none are returned as they are."""
    if isinstance(obj, kind):
        return fn(obj)
    if isinstance(obj, tuple | list):
        items = [_swap(o, kind, fn) for o in obj]
        changed = any(n is not o for n, o in zip(items, obj, strict=True))
        return (items if isinstance(obj, list) else tuple(items)) if changed else obj
    if isinstance(obj, dict):
        values = {k: _swap(v, kind, fn) for k, v in obj.items()}
        return values if any(values[k] is not v for k, v in obj.items()) else obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = [f.name for f in dataclasses.fields(obj) if f.init]
        changes = {n: _swap(getattr(obj, n), kind, fn) for n in fields}
        changes = {n: v for n, v in changes.items() if v is not getattr(obj, n)}
        return dataclasses.replace(obj, **changes) if changes else obj
    return obj


def _same_values(a: np.ndarray) -> tuple[Any, ...]:
    """What makes two arrays the same input: their memory, shape, strides and dtype, not
    their Python identity (views of one model, as devices decode a shared start model,
    are one input)."""
    return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _view(shm: SharedMemory, ref: _Ref) -> np.ndarray:
    return np.ndarray(ref.shape, np.dtype(ref.dtype), buffer=shm.buf, offset=ref.offset)


def balance(costs: Sequence[float], bins: int) -> list[list[int]]:
    """Indices of ``costs`` in ``bins`` batches, largest first onto the lightest batch
    (Graham's LPT rule); each batch keeps its indices in ascending order, empty ones
    are dropped. Ties go to the lowest batch and equal costs to the lowest index, so the
    split is a function of the costs alone."""
    loads = [0.0] * max(1, bins)
    batches: list[list[int]] = [[] for _ in loads]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        j = min(range(len(loads)), key=lambda j: (loads[j], j))
        batches[j].append(i)
        loads[j] += costs[i]
    return [sorted(b) for b in batches if b]


def _shm_free_bytes() -> int:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class _Block:
    """A shared-memory block the parent owns, grown (replaced) when too small."""

    def __init__(self) -> None:
        self.shm: SharedMemory | None = None

    def reserve(self, nbytes: int) -> SharedMemory | None:
        """A block of at least ``nbytes``; None when ``/dev/shm`` has no room for it (a
        container's default is 64 MB, and writing past it is SIGBUS): then the pipes."""
        if self.shm is None or self.shm.size < nbytes:
            self.close()
            size = max(_aligned(nbytes), 1 << 20)
            if size > _shm_free_bytes() // 2:
                return None
            self.shm = SharedMemory(create=True, size=size)
        return self.shm

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm.unlink()
            self.shm = None


# -- worker side -------------------------------------------------------------------------------

_RUNNER: Any = None
_ATTACHED: dict[str, SharedMemory] = {}


def _started() -> bool:
    return True


def _init_worker(make_runner: Callable[[], Any]) -> None:
    global _RUNNER
    _RUNNER = make_runner()


def _attach(names: set[str]) -> None:
    """Map the blocks ``names`` here; unmap blocks the parent has since replaced."""
    for old in set(_ATTACHED) - names:
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with the process
            _ATTACHED.pop(old).close()
    for name in names - set(_ATTACHED):
        # With fork the workers share the parent's resource tracker, which holds each
        # name once and forgets it when the parent unlinks the block.
        _ATTACHED[name] = SharedMemory(name=name)


def _run_batch(
    method: str, calls: list[tuple[Any, ...]], in_name: str | None, out_name: str | None, slots: list[tuple[int, int]]
) -> list[Any]:
    """Run ``calls`` here; large result arrays go to each call's (offset, size) slot of the output block."""
    _attach({n for n in (in_name, out_name) if n})
    blocks = {"in": _ATTACHED[in_name] if in_name else None, "out": _ATTACHED[out_name] if out_name else None}

    def read(ref: _Ref) -> np.ndarray:
        shm = blocks[ref.block]
        assert shm is not None
        view = _view(shm, ref)
        view.flags.writeable = False  # the parent's model: never changed in place
        return view

    results = []
    method_fn = getattr(_RUNNER, method)
    for args, (start, size) in zip(calls, slots, strict=True):
        out = method_fn(*_swap(args, _Ref, read))
        used = 0

        def write(a: np.ndarray, start: int = start, size: int = size) -> Any:
            nonlocal used
            out_shm = blocks["out"]
            if out_shm is None or a.nbytes < SHARE_MIN_BYTES or used + a.nbytes > size:
                return a  # small, or no room: by pipe
            ref = _Ref("out", start + used, a.shape, a.dtype.str)
            _view(out_shm, ref)[...] = a
            used += _aligned(a.nbytes)
            return ref

        results.append(_swap(out, np.ndarray, write))
    return results


# -- parent side -------------------------------------------------------------------------------


class SharedPool:
    """``workers`` forked processes, each running calls on ``make_runner()``'s object.

    Parameters
    ----------
    workers : processes.
    make_runner : builds a worker's runner (called once in each worker after the fork,
        so what it closes over is shared copy-on-write).
    slot_bytes : room for one call's large results in the output block (a call's
        results beyond it travel by pipe).
    """

    def __init__(self, workers: int, make_runner: Callable[[], Any], slot_bytes: int) -> None:
        resource_tracker.ensure_running()  # before the fork: the workers must share it
        self.workers = workers
        self.slot_bytes = _aligned(slot_bytes)
        self.inputs, self.outputs = _Block(), _Block()
        self.executor = ProcessPoolExecutor(
            workers, mp_context=mp.get_context("fork"), initializer=_init_worker, initargs=(make_runner,)
        )
        # The workers fork now, with every object of this process frozen out of the
        # garbage collector: a child inherits them all, and collecting the parent's
        # cycles there runs finalizers (of interpreters, sockets, threads' state) in a
        # process where those threads do not exist. Under the whole test suite a worker
        # died of exactly that (SIGSEGV while "Garbage-collecting" in _swap). The
        # parent's own garbage is collected first, here, where it is safe.
        gc.collect()
        gc.freeze()
        try:
            self.executor.submit(_started).result()  # with the fork context, every worker starts at once
        except BaseException:
            self.executor.shutdown(wait=False, cancel_futures=True)  # a runner that cannot start: no pool
            raise
        finally:
            gc.unfreeze()

    def _share_inputs(self, calls: Sequence[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], str | None]:
        distinct: dict[tuple[Any, ...], np.ndarray] = {}

        def collect(a: np.ndarray) -> np.ndarray:
            if a.nbytes >= SHARE_MIN_BYTES:
                distinct.setdefault(_same_values(a), a)
            return a

        _swap(list(calls), np.ndarray, collect)
        if not distinct:
            return list(calls), None
        offsets, total = {}, 0
        for key, a in distinct.items():
            offsets[key], total = total, total + _aligned(a.nbytes)
        shm = self.inputs.reserve(total)
        if shm is None:
            return list(calls), None
        refs = {}
        for key, a in distinct.items():
            ref = _Ref("in", offsets[key], a.shape, a.dtype.str)
            _view(shm, ref)[...] = a
            refs[key] = ref

        def swap(a: np.ndarray) -> Any:
            return refs.get(_same_values(a), a)

        return [_swap(c, np.ndarray, swap) for c in calls], shm.name

    def map(self, method: str, calls: Sequence[tuple[Any, ...]], costs: Sequence[float] | None = None) -> list[Any]:
        """``[runner.method(*c) for c in calls]``, one task per worker."""
        if not calls:
            return []
        shared, in_name = self._share_inputs(calls)
        out = self.outputs.reserve(self.slot_bytes * len(calls))
        out_name = out.name if out is not None else None
        batches = balance(list(costs) if costs is not None else [1.0] * len(calls), self.workers)
        futures: list[Future[list[Any]]] = [
            self.executor.submit(
                _run_batch,
                method,
                [shared[i] for i in b],
                in_name,
                out_name,
                [(i * self.slot_bytes, self.slot_bytes) for i in b],
            )
            for b in batches
        ]
        results: list[Any] = [None] * len(calls)
        for b, future in zip(batches, futures, strict=True):
            for i, r in zip(b, future.result(), strict=True):
                results[i] = _swap(r, _Ref, self._copy_out)
        return results

    def _copy_out(self, ref: _Ref) -> np.ndarray:
        assert self.outputs.shm is not None
        return _view(self.outputs.shm, ref).copy()  # the block is reused by the next map

    def close(self) -> None:
        self.executor.shutdown(cancel_futures=True)
        self.inputs.close()
        self.outputs.close()
