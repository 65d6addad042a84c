"""The model worker: one thread that owns the LiteRT interpreter, at background priority.

Training is the long, CPU-bound part of a device's work; everything else (MQTT
traffic, checking and reassembling frames, hand-offs, pings) is short and on the
round's critical path. The agent therefore runs every interpreter call (load, train,
evaluate) in this one thread and, by default, gives it Linux's ``SCHED_IDLE`` policy:
it uses all the CPU nobody else wants, and yields at once to the network thread,
to the rest of the agent, and to whatever else the board runs, which is how phones
schedule background learning. Interpreter helper threads (``--threads`` > 1) are
created by this thread and inherit its policy.

The policy is set once for the thread's whole life: an unprivileged thread may lower
its own priority but not raise it again. Where ``SCHED_IDLE`` does not exist (not
Linux) or is refused, the worker says so in the log and runs at normal priority.
On a machine that runs many agents at once (tests, ``bench/transport.py``), this is
what keeps 50 agents' training from starving the other agents' model downloads.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from device.errors import ConfigError

log = logging.getLogger("covey.device")

PRIORITIES = ("idle", "normal")
T = TypeVar("T")


def lower_thread_priority(priority: str) -> str:
    """Apply ``priority`` to the calling thread; returns the policy in effect."""
    if priority == "normal":
        return "normal"
    if not hasattr(os, "SCHED_IDLE"):
        log.info("this platform has no SCHED_IDLE; training runs at normal priority")
        return "normal"
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
    except OSError as exc:
        log.warning("could not give training SCHED_IDLE priority (%s); it runs at normal priority", exc)
        return "normal"
    return "idle"


class ModelWorker:
    """Runs model calls in one background thread; the caller waits with a timeout loop."""

    def __init__(self, priority: str = "idle", name: str = "covey-model") -> None:
        if priority not in PRIORITIES:
            raise ConfigError(f"training priority must be one of {PRIORITIES}, got {priority!r}")
        self.priority = priority
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=lower_thread_priority, initargs=(priority,)
        )

    def run(
        self,
        fn: Callable[..., T],
        *args: object,
        poll_s: float = 1.0,
        keep_waiting: Callable[[], bool] = lambda: True,
        **kwargs: object,
    ) -> T:
        """``fn(*args, **kwargs)`` in the worker thread; its exceptions are re-raised here.

        The wait is a loop of ``poll_s``-second timeouts. Training has no natural time
        bound (the server's deadline decides when a device is too late), so the caller
        decides with ``keep_waiting`` whether to go on; when it says no, the call is
        abandoned (it finishes in the background and its result is dropped).
        """
        future: Future[T] = self._pool.submit(fn, *args, **kwargs)
        while True:
            try:
                return future.result(timeout=poll_s)
            except FutureTimeout:
                if not keep_waiting():
                    raise TimeoutError("the model call was abandoned: the agent is stopping") from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
