"""Work units on threads of this process, each thread with its own interpreter.

LiteRT releases the GIL while an interpreter runs (``Invoke``), and a work unit
spends most of its time there: the FEMNIST MLP's 20 training steps of a client take
about 6 ms in the interpreter and a fraction of a millisecond in Python. So threads
train clients side by side as processes do, without their costs: no fork, no copy
of the data, and no model shipped in or out, since every thread reads the parent's
arrays and returns its own. On this 2-core machine ten FEMNIST MLP clients train in
52 ms on two threads with a one-thread interpreter each, against 88 ms on one
interpreter with two threads (an interpreter's own threads meet at every operator;
docs/results.md, "Simulation speed, fourth pass").

Each call goes to whichever thread is free next, the costliest first, so a slow
client does not hold up a batch. Work units are pure functions of their inputs (see
:mod:`server.simulation.trainer`), so the results do not depend on which thread runs
which call, nor on how many threads there are.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Literal

WorkerKind = Literal["thread", "process"]  # where a simulation's workers run when there are several
WORKER_KINDS: tuple[WorkerKind, ...] = ("thread", "process")


class ThreadWorkers:
    """``len(runners)`` threads, thread ``i`` calling methods of ``runners[i]`` only.

    Parameters
    ----------
    runners : one object per thread (a :class:`~server.simulation.trainer.Trainer`,
        which owns its interpreter: an interpreter must not run on two threads at once).
    """

    def __init__(self, runners: Sequence[Any]) -> None:
        if not runners:
            raise ValueError("ThreadWorkers needs at least one runner")
        self.runners = list(runners)
        self.executor = ThreadPoolExecutor(len(self.runners), thread_name_prefix="covey-worker")

    def map(self, method: str, calls: Sequence[tuple[Any, ...]], costs: Sequence[float] | None = None) -> list[Any]:
        """``[runner.method(*c) for c in calls]``, the costliest calls first, each on the
        next free thread; the first error any call raises is raised here."""
        if not calls:
            return []
        weights = list(costs) if costs is not None else [1.0] * len(calls)
        pending = iter(sorted(range(len(calls)), key=lambda i: (-weights[i], i)))
        lock = threading.Lock()
        failed = threading.Event()  # after an error the other threads take no new calls
        results: list[Any] = [None] * len(calls)

        def work(runner: Any) -> None:
            fn = getattr(runner, method)
            while not failed.is_set():
                with lock:
                    i = next(pending, None)
                if i is None:
                    return
                try:
                    results[i] = fn(*calls[i])
                except BaseException:
                    failed.set()
                    raise

        futures = [self.executor.submit(work, r) for r in self.runners[: len(calls)]]
        wait(futures)  # every runner is idle again before this returns or raises
        for future in futures:
            future.result()
        return results

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
