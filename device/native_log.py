"""Keeping the interpreter's one start-up banner off a user's terminal.

LiteRT (and tflite-runtime and TensorFlow Lite) print ``INFO: Created TensorFlow Lite
XNNPACK delegate for CPU.`` to the process's standard error, from C++, the first time
an interpreter allocates its tensors; no Python API or environment variable turns it
off (``TF_CPP_MIN_LOG_LEVEL`` does not reach it). :func:`first_allocation` runs that
first allocation with file descriptor 2 pointed at a temporary file, then writes back
everything it caught except that banner, so no other message is lost, only delayed by
the allocation. Later allocations run as they are.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

BANNER = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU."

_lock = threading.Lock()  # file descriptor 2 is the process's: one redirection at a time
_done = False  # the banner has been printed (once per process), caught or not


def first_allocation(allocate: Callable[..., Any], *args: Any) -> Any:
    """``allocate(*args)``; the first time in this process, with its banner caught."""
    global _done
    if _done:
        return allocate(*args)
    with _lock:
        if _done:
            return allocate(*args)
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no standard error to redirect: nothing to hide
            _done = True
            return allocate(*args)
        with tempfile.TemporaryFile() as caught:
            os.dup2(caught.fileno(), 2)
            try:
                return allocate(*args)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                _done = True
                caught.seek(0)
                kept = [line for line in caught.read().splitlines(keepends=True) if not line.startswith(BANNER)]
                if kept:
                    os.write(2, b"".join(kept))
