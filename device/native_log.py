"""Keeping the interpreter's one start-up banner off a user's terminal.

LiteRT (and tflite-runtime and TensorFlow Lite) print ``INFO: Created TensorFlow Lite
XNNPACK delegate for CPU.`` to the process's standard error, from C++, the first time
an interpreter allocates its tensors; no Python API or environment variable turns it
off (``TF_CPP_MIN_LOG_LEVEL`` does not reach it). :func:`first_allocation` runs that
first allocation with file descriptor 2 pointed at a temporary file, then writes back
everything it caught except that banner.

The redirection is the process's, for the few milliseconds of one allocation: what
other threads write to standard error meanwhile is written back after it, in order,
not lost (a crash inside that allocation would lose it). When the redirection cannot
be set up (no standard error, no temporary file), the allocation runs as it is and
the banner shows.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

BANNER = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU."

_lock = threading.Lock()  # file descriptor 2 is the process's: one redirection at a time
_done = False  # the first allocation ran (the banner comes once per process)


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a fork inside another thread's window must not inherit it held


os.register_at_fork(after_in_child=_after_fork)


def first_allocation(allocate: Callable[..., Any], *args: Any) -> Any:
    """``allocate(*args)``; the first time in this process, with its banner caught."""
    global _done
    if _done:
        return allocate(*args)
    with _lock:
        if _done:
            return allocate(*args)
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no standard error to redirect: nothing to hide
            _done = True
            return allocate(*args)
        try:
            caught = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the with below)
        except OSError:  # nowhere to catch it: the banner shows
            os.close(saved)
            _done = True
            return allocate(*args)
        with caught:
            os.dup2(caught.fileno(), 2)
            try:
                result = allocate(*args)
                _done = True
                return result
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                caught.seek(0)
                kept = [line for line in caught.read().splitlines(keepends=True) if not line.startswith(BANNER)]
                if kept:
                    with contextlib.suppress(OSError):  # a closed standard error: nothing to write to
                        os.write(2, b"".join(kept))
