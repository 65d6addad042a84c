"""The model artifact devices download: the zoo model without its initial values.

A device never trains from a model's built-in initial weights: every train,
pre-train and evaluate request brings the weights to start from. The initial
values are constants in the ``.tflite`` file that the init subgraph copies into
the resource variables. For the FEMNIST CNN the weights' are 26 MB of the file, and
26 MB of a board's memory. The FedProx anchor is a second 26 MB variable that
FedProx alone reads, and the kernel mirror (``models.layers.Layer.mirrors``) a
third, whose initial value is another 26 MB of the 55 MB file. So the coordinator
publishes a stripped copy: the init subgraph assigns only the buffers
(deferred-update factors, gradient sums), which must start at zero; every other
constant is gone.
A variable then comes into being at its first assignment: ``set_weights`` for the
weights and their mirrors, ``set_anchor`` for the anchor. The other signatures and their ops are
byte-for-byte the model's own, and training from the same weights gives the same
result (``tests/server/test_artifact.py``).

The manifest of the stripped copy says ``"initial_weights": false``, so the
device runtime refuses to read weights that were never set, with a clear error,
instead of failing inside LiteRT.

Flatbuffer surgery uses the schema that ships with ``ai_edge_litert``. TensorFlow
is not needed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from device.errors import ModelError

log = logging.getLogger("covey.server")

BUFFER_PREFIX = "buffer_"  # deferred-update factors, gradient sums: small, and must start at zero


def _schema() -> Any:
    try:
        from ai_edge_litert import schema_py_generated
    except ImportError as exc:  # pragma: no cover - ai_edge_litert is a server dependency
        raise ModelError(f"stripping a model for devices needs ai_edge_litert's schema ({exc})") from None
    return schema_py_generated


def strip_initial_values(model_bytes: bytes) -> bytes:
    """The model without the init-time assignments of weights and anchors."""
    schema = _schema()
    import flatbuffers

    try:
        model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    except Exception as exc:  # a corrupt flatbuffer raises anything from struct to IndexError
        raise ModelError(f"not a TFLite flatbuffer ({type(exc).__name__}: {exc})") from None
    ops = schema.BuiltinOperator

    def code(op: Any) -> int:
        oc = model.operatorCodes[op.opcodeIndex]
        return int(max(oc.builtinCode, oc.deprecatedBuiltinCode))

    init_indices = {
        op.builtinOptions.initSubgraphIndex
        for sg in model.subgraphs
        for op in sg.operators or []
        if code(op) == ops.CALL_ONCE
    }
    if len(init_indices) != 1:
        raise ModelError(f"expected one init subgraph, found {len(init_indices)}; is this a covey model?")
    init = model.subgraphs[init_indices.pop()]
    handles: dict[int, str] = {}  # resource tensor -> variable name
    for op in init.operators or []:
        if code(op) == ops.VAR_HANDLE:
            name = op.builtinOptions.sharedName
            handles[op.outputs[0]] = name.decode() if isinstance(name, bytes) else str(name)
    kept, dropped = [], []
    for op in init.operators or []:
        if code(op) == ops.ASSIGN_VARIABLE and not handles.get(op.inputs[0], "").startswith(BUFFER_PREFIX):
            dropped.append(op)
        else:
            kept.append(op)
    used = {i for op in kept for i in op.inputs}
    # The converter shares one constant among equal initial values (a bias's zeros and
    # a same-shaped buffer's zeros), so a constant a kept assignment reads stays.
    used_buffers = {init.tensors[i].buffer for i in used if init.tensors[i].buffer}
    freed = 0
    for op in dropped:
        value = init.tensors[op.inputs[1]]
        if value.buffer and op.inputs[1] not in used and value.buffer not in used_buffers:
            buffer = model.buffers[value.buffer]  # a constant: drop its data, point the tensor at none
            freed += len(buffer.data) if buffer.data is not None else 0
            buffer.data = None
            value.buffer = 0
    dropped_handles = {op.inputs[0] for op in dropped}
    init.operators = [op for op in kept if not (code(op) == ops.VAR_HANDLE and op.outputs[0] in dropped_handles - used)]
    if not freed:
        raise ModelError("the model's init subgraph assigns no constant weights; nothing to strip")
    builder = flatbuffers.Builder(max(1024, len(model_bytes) - freed + 1024 * 1024))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def device_artifact(model_bytes: bytes, manifest: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The stripped model and its manifest (new sha256, ``initial_weights: false``)."""
    stripped = strip_initial_values(model_bytes)
    device_manifest = {**manifest, "sha256": hashlib.sha256(stripped).hexdigest(), "initial_weights": False}
    return stripped, device_manifest


def write_device_artifact(model_path: Path, out_dir: Path) -> Path:
    """Write the device artifact of ``model_path`` and its manifest into ``out_dir``."""
    from device.manifest import manifest_path_for

    stripped, manifest = device_artifact(model_path.read_bytes(), json.loads(manifest_path_for(model_path).read_text()))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / model_path.name
    out.write_bytes(stripped)
    manifest_path_for(out).write_text(json.dumps(manifest))
    return out


def artifact_for_devices(model_path: Path, manifest: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """What a server publishes for devices: the stripped artifact and its manifest, or
    the model as it is (with a warning) when it cannot be stripped. The manifest's
    ``sha256`` is what the server names in its status."""
    model_bytes = Path(model_path).read_bytes()
    try:
        return device_artifact(model_bytes, manifest)
    except ModelError as exc:
        log.warning("publishing %s with its initial values: %s", Path(model_path).name, exc)
        return model_bytes, manifest
