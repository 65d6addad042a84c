"""TensorFlow, imported when a model is built and not before.

Listing the zoo (``covey model list``) or running a simulation with cached models
needs no TensorFlow: :mod:`models.layers` refers to it through :data:`tf`, a stand-in
that imports TensorFlow on its first attribute access, which happens only when a
layer builds its graph. Parameter counts come from the layers' shapes
(:class:`models.layers.ParamSpec`), so the table needs no built model.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["tensorflow", "tf"]

_lock = threading.Lock()
_module: Any = None


def tensorflow() -> Any:
    """The ``tensorflow`` module, imported on the first call."""
    global _module
    with _lock:
        if _module is None:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            import tensorflow as module

            module.get_logger().setLevel("ERROR")
            _module = module
    return _module


class _LazyTensorFlow:
    """``tf.anything`` imports TensorFlow and returns ``tensorflow.anything``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(tensorflow(), name)


tf: Any = _LazyTensorFlow()
