"""Checkpoints without pickle: JSON for structure, an ``.npz`` (``allow_pickle=False``)
for arrays.

A strategy's state is walked attribute by attribute. Objects are rebuilt only from
covey's own classes (modules under ``server.`` and ``device.``), by setting their
attributes, and never by running constructors or arbitrary callables. numpy
generators are restored from their bit-generator state. A tampered or foreign
checkpoint therefore fails with a clear error instead of executing anything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import ConfigError
from device.state import atomic_write

ALLOWED_PREFIXES = ("server.", "device.")


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, obj: Any) -> Any:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            key = f"a{len(self.arrays)}"
            self.arrays[key] = obj
            return {"__array__": key}
        if isinstance(obj, np.random.Generator):
            return {"__rng__": obj.bit_generator.state}
        if isinstance(obj, list):
            return {"__list__": [self.encode(v) for v in obj]}
        if isinstance(obj, tuple):
            return {"__tuple__": [self.encode(v) for v in obj]}
        if isinstance(obj, (set, frozenset)):
            return {"__set__": [self.encode(v) for v in sorted(obj, key=repr)]}
        if isinstance(obj, dict):
            return {"__dict__": [[self.encode(k), self.encode(v)] for k, v in obj.items()]}
        cls = type(obj)
        if cls.__module__.startswith(ALLOWED_PREFIXES):
            fields = (
                vars(obj)
                if not dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__")
                else {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            )
            return {"__obj__": f"{cls.__module__}:{cls.__qualname__}", "state": self.encode(dict(fields))}
        raise ConfigError(f"cannot checkpoint a {cls.__module__}.{cls.__qualname__}")


def _decode(tree: Any, arrays: Any) -> Any:
    if not isinstance(tree, dict):
        if isinstance(tree, list):
            raise ConfigError("malformed checkpoint: bare list")
        return tree
    if "__array__" in tree:
        return np.array(arrays[tree["__array__"]])
    if "__rng__" in tree:
        state = tree["__rng__"]
        name = state.get("bit_generator")
        if name not in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"):
            raise ConfigError(f"checkpoint names an unknown bit generator {name!r}")
        bit_gen = getattr(np.random, name)()
        bit_gen.state = state
        return np.random.Generator(bit_gen)
    if "__list__" in tree:
        return [_decode(v, arrays) for v in tree["__list__"]]
    if "__tuple__" in tree:
        return tuple(_decode(v, arrays) for v in tree["__tuple__"])
    if "__set__" in tree:
        return {_decode(v, arrays) for v in tree["__set__"]}
    if "__dict__" in tree:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in tree["__dict__"]}
    if "__obj__" in tree:
        module_name, _, qualname = str(tree["__obj__"]).partition(":")
        if not module_name.startswith(ALLOWED_PREFIXES):
            raise ConfigError(f"checkpoint refers to {module_name!r}, outside covey")
        cls: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not isinstance(cls, type):
            raise ConfigError(f"checkpoint refers to {qualname!r}, which is not a class")
        obj: Any = object.__new__(cls)
        for key, value in _decode(tree["state"], arrays).items():
            object.__setattr__(obj, key, value)
        return obj
    raise ConfigError("malformed checkpoint entry")


def save(state: dict[str, Any], directory: Path, name: str = "checkpoint") -> None:
    """Write ``name.json`` and its arrays, ``name-<digest>.npz``: each to a temporary
    file, flushed to disk, then renamed, the arrays first. The arrays' file is named by
    its content and the JSON names it, so the JSON's rename switches from one whole
    checkpoint to the next: a crash at any point leaves the old one or the new one
    (a kill -9 between two fixed-name renames once left a pair that could not be
    resumed). Arrays no JSON names any more are removed afterwards."""
    enc = _Encoder()
    tree = enc.encode(state)
    buffer = io.BytesIO()
    np.savez(buffer, **enc.arrays)  # type: ignore[arg-type]
    arrays = buffer.getvalue()
    digest = hashlib.sha256(arrays).hexdigest()
    arrays_name = f"{name}-{digest[:16]}.npz"
    doc = {"arrays_sha256": digest, "arrays": arrays_name, "state": tree}
    atomic_write(directory / arrays_name, arrays)
    atomic_write(directory / f"{name}.json", json.dumps(doc).encode())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames themselves
    finally:
        os.close(fd)
    for old in [*directory.glob(f"{name}-*.npz"), directory / f"{name}.npz"]:
        if old.name != arrays_name:
            old.unlink(missing_ok=True)


def remove(directory: Path, name: str) -> None:
    for path in [directory / f"{name}.json", directory / f"{name}.npz", *directory.glob(f"{name}-*.npz")]:
        path.unlink(missing_ok=True)


def load(directory: Path, name: str = "checkpoint") -> dict[str, Any] | None:
    """The state saved by :func:`save`, or None when there is no checkpoint."""
    path = directory / f"{name}.json"
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or "state" not in doc:
            raise ValueError("not a covey checkpoint")
        arrays_name = doc.get("arrays", f"{name}.npz")  # checkpoints before content-named arrays
        if not isinstance(arrays_name, str) or Path(arrays_name).name != arrays_name:
            raise ValueError(f"its arrays file {arrays_name!r} is not a file name in {directory}")
        data = (directory / arrays_name).read_bytes()
        if hashlib.sha256(data).hexdigest() != doc.get("arrays_sha256"):
            raise ValueError(f"{arrays_name} does not belong to {name}.json (altered or copied by hand?)")
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            state = _decode(doc["state"], arrays)
    except (OSError, ValueError, KeyError, AttributeError, ImportError) as exc:
        raise ConfigError(f"checkpoint in {directory} cannot be read ({exc}); remove it to start afresh") from None
    if not isinstance(state, dict):
        raise ConfigError(f"checkpoint in {directory} is not a state dictionary")
    return state
