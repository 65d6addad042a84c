"""Work units on threads of this process, each thread with its own interpreter.

LiteRT releases the GIL while an interpreter runs (``Invoke``), and a work unit
spends most of its time there: a client's training steps run in the interpreter, and
only a small share of each step in Python. So threads train clients side by side as
processes do, without their costs: no fork, no copy of the data, and no model shipped
in or out, since every thread reads the parent's arrays and returns its own. On two
cores, two threads with a one-thread interpreter each train a round's clients faster
than one interpreter with two threads: an interpreter's own threads meet at every
operator, and two interpreters never wait for each other (measured in
docs/results.md, "Simulation speed").

Each call goes to whichever thread is free next, the costliest first, so a slow
client does not hold up a batch. Work units are pure functions of their inputs (see
:mod:`server.simulation.trainer`), so the results do not depend on which thread runs
which call, nor on how many threads there are.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import Any, Literal

WorkerKind = Literal["thread", "process"]  # where a simulation's workers run when there are several
WORKER_KINDS: tuple[WorkerKind, ...] = ("thread", "process")
# The default stops at 4: each worker holds its own interpreter (hundreds of MB for the
# FEMNIST CNN), and the Python share of every training step runs under the GIL, so
# many threads would queue on it (measured on 2 cores only: docs/results.md, "Simulation
# speed").
MAX_DEFAULT_WORKERS = 4


CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # a container's CPU quota (cgroup v2)


def cpu_quota(cpu_max: Path = CPU_MAX) -> int | None:
    """The cores a cgroup v2 CPU quota allows (``"150000 100000"``: 2), or None without
    one (``"max ..."``, no such file, or anything unreadable)."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def default_workers(cpu_max: Path = CPU_MAX) -> int:
    """Workers when the user names none: one per core this process may use (its CPU
    affinity, and a container's CPU quota: ``docker run --cpus 1`` on a 16-core host is
    one core), at most :data:`MAX_DEFAULT_WORKERS`. Any number gives the same results."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(cpu_max)
    return max(1, min(cores if quota is None else min(cores, quota), MAX_DEFAULT_WORKERS))


class ThreadWorkers:
    """Work units on ``len(runners)`` threads, each call on one of ``runners``.

    A runner runs one call at a time, whatever the caller does (each holds a lock while
    it runs one), so an interpreter never runs on two threads at once.

    Parameters
    ----------
    runners : one object per thread (a :class:`~server.simulation.trainer.Trainer`,
        which owns its interpreter).
    """

    def __init__(self, runners: Sequence[Any]) -> None:
        if not runners:
            raise ValueError("ThreadWorkers needs at least one runner")
        self.runners = list(runners)
        self._busy = [threading.Lock() for _ in self.runners]
        self._stop = threading.Event()  # the running map's: set on an error or an interrupt
        self.executor = ThreadPoolExecutor(len(self.runners), thread_name_prefix="covey-worker")

    def map(
        self, method: str | Callable[..., Any], calls: Sequence[tuple[Any, ...]], costs: Sequence[float] | None = None
    ) -> list[Any]:
        """``[runner.method(*c) for c in calls]`` (or ``method(runner, *c)`` for a
        function), the costliest calls first, each on the next free runner. After an
        error the runners take no new calls, and the error raised here is the first one
        any call raised. An interrupt while waiting (Ctrl-C) stops the runners in the
        same way, and this returns or raises only once every runner is idle again."""
        if not calls:
            return []
        weights = list(costs) if costs is not None else [1.0] * len(calls)
        pending = iter(sorted(range(len(calls)), key=lambda i: (-weights[i], i)))
        lock = threading.Lock()
        stop = self._stop = threading.Event()
        errors: list[BaseException] = []
        results: list[Any] = [None] * len(calls)

        def work(index: int) -> None:
            runner = self.runners[index]
            with self._busy[index]:
                fn = getattr(runner, method) if isinstance(method, str) else partial(method, runner)
                while not stop.is_set():
                    with lock:
                        i = next(pending, None)
                    if i is None:
                        return
                    try:
                        results[i] = fn(*calls[i])
                    except BaseException as exc:
                        with lock:
                            errors.append(exc)
                        stop.set()
                        return

        futures: list[Future[None]] = []
        try:
            for k in range(min(len(self.runners), len(calls))):
                futures.append(self.executor.submit(work, k))
            wait(futures)
        except BaseException:
            stop.set()
            wait(futures)  # every runner idle before the caller goes on (or runs another map)
            raise
        if errors:
            raise errors[0]
        return results

    def close(self) -> None:
        self._stop.set()
        self.executor.shutdown(wait=True, cancel_futures=True)
