"""TensorFlow, imported when a model is built and not before, without its banners.

Listing the zoo (``covey model list``) or running a simulation with cached models
needs no TensorFlow: :mod:`models.layers` refers to it through :data:`tf`, a stand-in
that imports TensorFlow on its first attribute access, which happens only when a
layer builds its graph. Parameter counts come from the layers' shapes
(:class:`models.layers.ParamSpec`), so the table needs no built model.

When TensorFlow is imported, it is imported quietly. ``TF_CPP_MIN_LOG_LEVEL=3``
(unless the user set it) silences most of its C++ logging, but TensorFlow 2.21 writes
``oneDNN custom operations are on`` and absl's ``All log messages before
absl::InitializeLog()`` line to file descriptor 2 whatever that variable says. The
import therefore runs with descriptor 2 pointed at a temporary file; afterwards the
known banner lines are dropped and anything else it wrote (an error, another
thread's output) is written to stderr as it came. A user who sets
``TF_CPP_MIN_LOG_LEVEL=0`` asks for TensorFlow's logging and sees all of it;
otherwise TensorFlow's Python loggers (``tensorflow``, ``absl``) report errors only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["BANNERS", "tensorflow", "tf"]

# Fragments of the lines TensorFlow prints on import, whatever the log level.
BANNERS = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "cpu_feature_guard.cc",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)

_lock = threading.Lock()
_module: Any = None


def tensorflow() -> Any:
    """The ``tensorflow`` module, imported quietly on the first call."""
    global _module
    with _lock:
        if _module is None:
            _module = _import_quietly()
    return _module


class _LazyTensorFlow:
    """``tf.anything`` imports TensorFlow (quietly) and returns ``tensorflow.anything``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(tensorflow(), name)


tf: Any = _LazyTensorFlow()


def _import_quietly() -> Any:
    wants_logs = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with contextlib.nullcontext() if wants_logs else _without_banners():
        import tensorflow as module
    if not wants_logs:
        module.get_logger().setLevel("ERROR")
        # TensorFlow's Python side also logs through absl (SavedModel's notes on renamed
        # inputs at INFO): noise for someone who asked covey, not TensorFlow, to be verbose
        logging.getLogger("absl").setLevel(logging.ERROR)
    return module


@contextlib.contextmanager
def _without_banners() -> Iterator[None]:
    """Run the body with descriptor 2 captured; then pass on all but :data:`BANNERS`."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (a daemon), or stderr is closed
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not any(b in line for b in BANNERS)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
