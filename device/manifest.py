"""The JSON manifest that travels beside every ``.tflite`` model.

A manifest names the model, its input shape and dtype, its number of classes, the
layout of the flat weight vector (name, shape and offset of every tensor), the
parameter count, the sha256 of the ``.tflite`` file and the covey version that built
it. :func:`load_manifest` validates every field before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device.errors import ModelError

MANIFEST_FORMAT = 1
REQUIRED_SIGNATURES = ("train", "infer", "evaluate", "get_weights", "set_weights")


@dataclass(frozen=True)
class TensorLayout:
    """Where one trainable tensor sits in the flat weight vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Manifest:
    """A validated model manifest."""

    model: str
    input_shape: tuple[int, ...]
    input_dtype: str
    n_classes: int
    n_params: int
    tensors: tuple[TensorLayout, ...]
    signatures: tuple[str, ...]
    sha256: str
    covey_version: str
    description: str = ""
    deferred_rank: int = 0
    accumulate_chunk: int = 0
    # False for the artifact devices download (server/artifact.py): the file carries no
    # initial weights, so weights must be set before anything reads them
    initial_weights: bool = True

    def tensor_sizes(self) -> tuple[int, ...]:
        """The tensors' sizes in the order they sit in the flat weight vector."""
        return tuple(t.size for t in sorted(self.tensors, key=lambda t: t.offset))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "description": self.description,
            "input_shape": list(self.input_shape),
            "input_dtype": self.input_dtype,
            "label_dtype": "int32",
            "n_classes": self.n_classes,
            "n_params": self.n_params,
            "tensors": [{"name": t.name, "shape": list(t.shape), "offset": t.offset} for t in self.tensors],
            "signatures": list(self.signatures),
            "deferred_rank": self.deferred_rank,
            "accumulate_chunk": self.accumulate_chunk,
            "sha256": self.sha256,
            "covey_version": self.covey_version,
            "initial_weights": self.initial_weights,
        }


def _field(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in raw:
        raise ModelError(f"{where}: manifest has no {key!r} field; rebuild it with `covey model build`")
    value = raw[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ModelError(f"{where}: manifest field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _shape(value: Any, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value):
        raise ModelError(f"{where}: manifest field {key!r} must be a list of positive integers, got {value!r}")
    return tuple(value)


def parse_manifest(raw: Any, where: str = "manifest") -> Manifest:
    """Validate a decoded manifest (a dict) and return it as a :class:`Manifest`."""
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: a manifest must be a JSON object, got {type(raw).__name__}")
    fmt = _field(raw, "format", int, where)
    if fmt != MANIFEST_FORMAT:
        raise ModelError(f"{where}: manifest format {fmt} is not supported (this covey reads {MANIFEST_FORMAT})")
    input_dtype = _field(raw, "input_dtype", str, where)
    if input_dtype != "float32":
        raise ModelError(f"{where}: input_dtype {input_dtype!r} is not supported (float32 only)")
    n_classes = _field(raw, "n_classes", int, where)
    n_params = _field(raw, "n_params", int, where)
    if n_classes < 2 or n_params < 1:
        raise ModelError(f"{where}: n_classes must be >= 2 and n_params >= 1")
    tensors = []
    expected = 0
    for i, item in enumerate(_field(raw, "tensors", list, where)):
        if not isinstance(item, dict):
            raise ModelError(f"{where}: tensors[{i}] must be an object")
        layout = TensorLayout(
            name=_field(item, "name", str, f"{where} tensors[{i}]"),
            shape=_shape(item.get("shape"), "shape", f"{where} tensors[{i}]"),
            offset=_field(item, "offset", int, f"{where} tensors[{i}]"),
        )
        if layout.offset != expected:
            raise ModelError(f"{where}: tensor {layout.name} starts at {layout.offset}, expected {expected}")
        expected += layout.size
        tensors.append(layout)
    if expected != n_params:
        raise ModelError(f"{where}: tensors hold {expected} parameters but n_params is {n_params}")
    signatures = tuple(_field(raw, "signatures", list, where))
    if not all(isinstance(sig, str) for sig in signatures):
        raise ModelError(f"{where}: manifest field 'signatures' must be a list of names (strings)")
    missing = [s for s in REQUIRED_SIGNATURES if s not in signatures]
    if missing:
        raise ModelError(f"{where}: model lacks signatures {missing}")
    deferred_rank = raw.get("deferred_rank", 0)
    if not isinstance(deferred_rank, int) or isinstance(deferred_rank, bool) or deferred_rank < 0:
        raise ModelError(f"{where}: deferred_rank must be a non-negative integer, got {deferred_rank!r}")
    if deferred_rank and not {"train_deferred", "flush"} <= set(signatures):
        raise ModelError(f"{where}: deferred_rank is set but train_deferred/flush signatures are missing")
    accumulate_chunk = raw.get("accumulate_chunk", 0)
    if not isinstance(accumulate_chunk, int) or isinstance(accumulate_chunk, bool) or accumulate_chunk < 0:
        raise ModelError(f"{where}: accumulate_chunk must be a non-negative integer, got {accumulate_chunk!r}")
    if accumulate_chunk and not {"accumulate", "apply_accumulated", "apply_accumulated_prox"} <= set(signatures):
        raise ModelError(f"{where}: accumulate_chunk is set but accumulate/apply_accumulated signatures are missing")
    initial_weights = raw.get("initial_weights", True)
    if not isinstance(initial_weights, bool):
        raise ModelError(f"{where}: initial_weights must be true or false, got {initial_weights!r}")
    sha = _field(raw, "sha256", str, where)
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ModelError(f"{where}: sha256 {sha!r} is not a hex digest")
    return Manifest(
        model=_field(raw, "model", str, where),
        input_shape=_shape(raw.get("input_shape"), "input_shape", where),
        input_dtype=input_dtype,
        n_classes=n_classes,
        n_params=n_params,
        tensors=tuple(tensors),
        signatures=signatures,
        sha256=sha,
        covey_version=_field(raw, "covey_version", str, where),
        description=raw.get("description", "") if isinstance(raw.get("description"), str) else "",
        deferred_rank=deferred_rank,
        accumulate_chunk=accumulate_chunk,
        initial_weights=initial_weights,
    )


def manifest_path_for(model_path: Path) -> Path:
    """The manifest that belongs to ``NAME.tflite`` is ``NAME.json`` beside it."""
    return model_path.with_suffix(".json")


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ModelError(
            f"manifest {path} not found; every .tflite needs its NAME.json beside it (`covey model build` writes both)"
        ) from None
    except OSError as exc:
        raise ModelError(f"cannot read manifest {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"manifest {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return parse_manifest(raw, str(path))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_verified_model(model_path: Path, manifest: Manifest) -> bytes:
    """Read a ``.tflite`` file and check it against the manifest's sha256."""
    try:
        data = model_path.read_bytes()
    except FileNotFoundError:
        raise ModelError(f"model file {model_path} not found") from None
    except OSError as exc:
        raise ModelError(f"cannot read model file {model_path}: {exc.strerror}") from None
    digest = sha256_hex(data)
    if digest != manifest.sha256:
        raise ModelError(
            f"{model_path} has sha256 {digest[:12]}… but its manifest expects "
            f"{manifest.sha256[:12]}…: the file is corrupt or belongs to another build; "
            "rebuild or re-download both files together"
        )
    return data
