"""Workers: threads with an interpreter each, or processes with batched calls and
weights through shared memory; results bit for bit those of one worker."""

from __future__ import annotations

import copy
import gc
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.simulation.datasets import Federation, SwapShift, leaf
from server.simulation.engine import Simulation
from server.simulation.pool import SHARE_MIN_BYTES, SharedPool, balance
from server.simulation.threads import WORKER_KINDS, ThreadWorkers, WorkerKind
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.05)
SETTINGS: dict[str, dict[str, Any]] = {
    "fedavg": {"clients_per_round": 6},  # parallel members, each returning its weights
    "fedgsp": {"beta": 2, "kappa": 1.0},  # chains
    "fedgroup": {"n_groups": 2, "clients_per_round": 6, "alpha": 3, "pretrain_steps": 3},  # pre-training
}


@pytest.fixture(scope="module")
def writers() -> Federation:
    from covey.paths import femnist_dir

    fed = leaf(femnist_dir())
    return {c: fed[c] for c in sorted(fed)[:12]}


def _run(name: str, writers: Federation, model: Any, workers: int, kind: WorkerKind, shift: SwapShift | None = None):
    strategy = make_strategy(name, train=TRAIN, **SETTINGS[name])
    fed = copy.deepcopy(writers) if shift is not None else dict(writers)  # "part" changes the clients' data
    sim = Simulation(strategy, fed, model, seed=3, workers=workers, worker_kind=kind, shift=shift)
    records = sim.run(3)
    rows = [(r.federated_accuracy, r.federated_loss, r.train_loss, float(r.trained)) for r in records]
    return rows, [strategy.model_for(c) for c in sorted(writers)]


_ONE_WORKER: dict[str, Any] = {}  # strategy -> the one-worker run, shared by both kinds


@pytest.mark.slow
@pytest.mark.parametrize("kind", WORKER_KINDS)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_two_workers_give_bit_identical_results_to_one(
    name: str, kind: WorkerKind, writers: Federation, zoo_model
) -> None:
    model = zoo_model("mlp_femnist")  # 1.7 MB of weights: the shared-memory path, not the pipe
    if name not in _ONE_WORKER:
        _ONE_WORKER[name] = _run(name, writers, model, 1, kind)
    rows1, models1 = _ONE_WORKER[name]

    rows2, models2 = _run(name, writers, model, 2, kind)

    assert rows1 == rows2
    assert models1[0].nbytes >= SHARE_MIN_BYTES
    for a, b in zip(models1, models2, strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all", "part"])
def test_thread_workers_see_a_distribution_shift_as_one_worker_does(mode: str, writers: Federation, zoo_model) -> None:
    """Thread workers read the federation the shift changes in place (processes are
    forked again after it): the shifted runs agree bit for bit, and data did move."""
    model = zoo_model("mlp_femnist")
    shifts = {w: SwapShift(probability=1.0, mode=mode) for w in (1, 2)}

    runs = {w: _run("fedavg", writers, model, w, "thread", shifts[w]) for w in (1, 2)}

    assert runs[1][0] == runs[2][0]
    for a, b in zip(runs[1][1], runs[2][1], strict=True):
        assert a.tobytes() == b.tobytes()
    assert runs[1][0] != _run("fedavg", writers, model, 1, "thread")[0]  # the shift changed the run


class _Recorder:
    """Counts how many calls run on it at once; ``fail`` raises on one value."""

    def __init__(self, name: str, started: threading.Barrier | None = None) -> None:
        self.name, self.started = name, started
        self.lock, self.active, self.most = threading.Lock(), 0, 0

    def tag(self, value: int) -> tuple[str, int]:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        if self.started is not None:
            self.started.wait(timeout=30)  # both runners busy at once: they run side by side
        with self.lock:
            self.active -= 1
        return self.name, value * 10

    def fail(self, value: int) -> int:
        if value == 3:
            raise RuntimeError("client 3 diverged")
        return value


def test_thread_workers_run_side_by_side_and_return_results_in_call_order() -> None:
    started = threading.Barrier(2)
    runners = [_Recorder("a", started), _Recorder("b", started)]
    workers = ThreadWorkers(runners)
    try:
        out = workers.map("tag", [(1,), (2,)], [1.0, 5.0])
        runners[0].started = runners[1].started = None
        more = workers.map("tag", [(i,) for i in range(7)], [float(i) for i in range(7)])
    finally:
        workers.close()

    assert sorted(o[0] for o in out) == ["a", "b"]  # each call on its own runner, at the same time
    assert [o[1] for o in out] == [10, 20] and [o[1] for o in more] == [i * 10 for i in range(7)]
    assert [r.most for r in runners] == [1, 1]  # a runner (an interpreter) never runs two calls at once


def test_a_failing_call_raises_from_map_and_the_workers_stay_usable() -> None:
    workers = ThreadWorkers([_Recorder("a"), _Recorder("b")])
    try:
        with pytest.raises(RuntimeError, match="client 3 diverged"):
            workers.map("fail", [(i,) for i in range(6)])
        again = workers.map("fail", [(1,), (2,)])
    finally:
        workers.close()

    assert again == [1, 2]


def test_balance_puts_the_largest_first_on_the_lightest_worker() -> None:
    # 5 -> A, 4 -> B, 3 -> B (7), 2 -> A (7), 1 -> A (the tie goes to the first): loads 8 and 7
    assert balance([5, 1, 4, 2, 3], 2) == [[0, 1, 3], [2, 4]]
    assert balance([1.0] * 3, 5) == [[0], [1], [2]]  # no empty batches
    assert balance([], 2) == []


class _Echo:
    def twice(self, a: np.ndarray, tag: str) -> tuple[str, np.ndarray, np.ndarray]:
        return tag, a * 2, a[:3].copy()


def test_the_pool_returns_large_arrays_through_shared_memory_and_small_ones_by_pipe() -> None:
    big = np.arange(SHARE_MIN_BYTES, dtype=np.float32)  # 4x the threshold
    other = big[::-1].copy()
    pool = SharedPool(2, _Echo, slot_bytes=big.nbytes)
    try:
        calls = [(big, "a"), (other, "b"), (big, "c")]
        out = pool.map("twice", calls, [1.0, 2.0, 3.0])
        again = pool.map("twice", [(big * 3, "d")])  # the blocks are reused for the next map
    finally:
        pool.close()

    assert [o[0] for o in out] == ["a", "b", "c"]
    for (a, _), (_, doubled, head) in zip(calls, out, strict=True):
        np.testing.assert_array_equal(doubled, a * 2)
        np.testing.assert_array_equal(head, a[:3])
    np.testing.assert_array_equal(again[0][1], big * 6)


def test_without_room_in_dev_shm_the_pool_falls_back_to_the_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    from server.simulation import pool as pool_module

    monkeypatch.setattr(pool_module, "_shm_free_bytes", lambda: 0)  # as in a container with a 64 MB /dev/shm
    big = np.arange(SHARE_MIN_BYTES, dtype=np.float32)
    pool = SharedPool(2, _Echo, slot_bytes=big.nbytes)
    try:
        out = pool.map("twice", [(big, "a"), (big + 1, "b")])
        assert pool.inputs.shm is None and pool.outputs.shm is None
    finally:
        pool.close()

    np.testing.assert_array_equal(out[1][1], (big + 1) * 2)


class _Gate:
    """Each call waits for ``release``: calls are in progress when the caller is interrupted."""

    def __init__(self, release: threading.Event) -> None:
        self.release, self.ran = release, []

    def step(self, value: int) -> int:
        self.release.wait(timeout=30)
        self.ran.append(value)
        return value


def test_an_interrupt_while_waiting_stops_the_runners_before_map_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the caller: the runners finish the calls they are in and take no more,
    and map raises only when every runner is idle, so the next map cannot put an
    interpreter on two threads at once."""
    from server.simulation import threads

    release = threading.Event()
    runners = [_Gate(release), _Gate(release)]
    workers = ThreadWorkers(runners)
    real_wait, waits = threads.wait, []

    def interrupted(futures: Any, *args: Any, **kwargs: Any) -> Any:
        waits.append(len(futures))
        if len(waits) == 1:
            release.set()  # the calls in progress may finish now
            raise KeyboardInterrupt
        return real_wait(futures, *args, **kwargs)

    monkeypatch.setattr(threads, "wait", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            workers.map("step", [(i,) for i in range(10)])
        busy = [lock.locked() for lock in workers._busy]
        ran = sum(len(r.ran) for r in runners)
        again = workers.map("step", [(i,) for i in range(4)])
    finally:
        workers.close()

    assert busy == [False, False] and ran <= 2  # idle, after at most the calls in progress
    assert again == [0, 1, 2, 3]


def test_an_interrupt_between_two_submits_still_waits_for_the_runner_already_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C after the first runner's loop was submitted and before the second: map
    raises only once that first loop has stopped."""
    release = threading.Event()
    runners = [_Gate(release), _Gate(release)]
    workers = ThreadWorkers(runners)
    real_submit, submitted = workers.executor.submit, []

    def submit(fn: Any, *args: Any) -> Any:
        submitted.append(args)
        if len(submitted) == 2:
            release.set()
            raise KeyboardInterrupt
        return real_submit(fn, *args)

    monkeypatch.setattr(workers.executor, "submit", submit)
    try:
        with pytest.raises(KeyboardInterrupt):
            workers.map("step", [(i,) for i in range(6)])
        busy = [lock.locked() for lock in workers._busy]
    finally:
        workers.close()

    assert busy == [False, False]
    assert len(runners[0].ran) <= 1 and not runners[1].ran  # the started loop stopped after its call


def test_thread_workers_call_a_function_with_the_runner_first() -> None:
    workers = ThreadWorkers([_Recorder("a"), _Recorder("b")])
    try:
        out = workers.map(lambda runner, i: (runner.name, i * 3), [(i,) for i in range(5)])
    finally:
        workers.close()

    assert [o[1] for o in out] == [0, 3, 6, 9, 12]
    assert {o[0] for o in out} <= {"a", "b"}


class _Collector:
    """Runs the garbage collector in the worker, as any allocation-heavy call may."""

    def collect(self, value: int) -> int:
        gc.collect()
        return value


class _Finalized:
    """A cycle whose finalizer records the process it ran in."""

    def __init__(self, record: Path) -> None:
        self.record, self.me = record, self

    def __del__(self) -> None:
        with self.record.open("a") as f:
            f.write(f"{os.getpid()}\n")


def test_the_parents_garbage_is_never_finalized_in_a_forked_worker(tmp_path: Path) -> None:
    # Under the whole suite a worker died of SIGSEGV while collecting garbage it had
    # inherited: finalizers of the parent's objects ran in a process without their threads.
    # Prepare: a garbage cycle the parent has not collected when the workers fork
    record = tmp_path / "finalized.txt"
    gc.disable()
    try:
        _Finalized(record)  # unreachable at once; only the collector can free a cycle
        pool = SharedPool(2, _Collector, slot_bytes=1024)
    finally:
        gc.enable()
    try:
        # Execute: each worker collects its garbage
        out = pool.map("collect", [(1,), (2,)])
    finally:
        pool.close()

    # Assert: the cycle was finalized once, in the parent
    assert out == [1, 2]
    assert record.read_text().split() == [str(os.getpid())]


class _CannotStart:
    def __init__(self) -> None:
        raise RuntimeError("no model here")


def test_a_pool_whose_runner_cannot_start_says_so_when_it_is_made() -> None:
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        SharedPool(2, _CannotStart, slot_bytes=1024)
