"""Export zoo models to ``.tflite`` with builtin ops only, plus a JSON manifest.

The converter runs with ``TFLITE_BUILTINS`` alone, so an op without a builtin
kernel makes conversion fail; :func:`flex_ops` double-checks the written file for
custom (``Flex…``) operators, so a converter that silently fell back would be caught.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST_FORMAT = 1


def covey_version() -> str:
    try:
        return metadata.version("covey")
    except metadata.PackageNotFoundError:  # running from a checkout that is not installed
        return "0+unknown"


def _quiet_tensorflow() -> Any:
    from models.quiet_tf import tensorflow

    return tensorflow()


def convert(name: str, seed: int = 0) -> tuple[bytes, dict[str, Any]]:
    """Build the zoo model ``name`` and return (tflite bytes, manifest without sha256)."""
    tf = _quiet_tensorflow()
    from models.trainable import TrainableModel
    from models.zoo import get_architecture

    arch = get_architecture(name)
    module = TrainableModel(arch, seed=seed)
    signatures = module.signatures()
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(tmp, signature_keys=list(signatures))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.experimental_enable_resource_variables = True
        model_bytes: bytes = converter.convert()

    offset = 0
    tensors = []
    for spec in arch.param_specs():
        tensors.append({"name": spec.name, "shape": list(spec.shape), "offset": offset})
        offset += spec.size
    manifest = {
        "format": MANIFEST_FORMAT,
        "model": arch.name,
        "description": arch.description,
        "input_shape": list(arch.input_shape),
        "input_dtype": "float32",
        "label_dtype": "int32",
        "n_classes": arch.n_classes,
        "n_params": arch.n_params,
        "tensors": tensors,
        "signatures": sorted(signatures),
        "deferred_rank": module.deferred_rank,
        "accumulate_chunk": arch.accumulate_chunk,
        "init_seed": seed,
        "covey_version": covey_version(),
    }
    return model_bytes, manifest


def flex_ops(model_bytes: bytes) -> list[str]:
    """Names of custom operators (Flex or otherwise) in a ``.tflite`` flatbuffer."""
    tf = _quiet_tensorflow()
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    custom = []
    for code in model.operatorCodes:
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        if builtin == schema.BuiltinOperator.CUSTOM or code.customCode:
            custom.append(code.customCode.decode() if code.customCode else "CUSTOM")
    del tf
    return custom


def builtin_op_names(model_bytes: bytes) -> set[str]:
    """Builtin operator names used anywhere in a ``.tflite`` flatbuffer."""
    _quiet_tensorflow()
    from tensorflow.lite.python import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    return {names[max(c.builtinCode, c.deprecatedBuiltinCode)] for c in model.operatorCodes}


def build(name: str, out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``NAME.tflite`` and ``NAME.json`` into ``out_dir``; return both paths.

    Raises
    ------
    RuntimeError
        If the converted model contains a custom (Flex) operator.
    """
    model_bytes, manifest = convert(name, seed)
    custom = flex_ops(model_bytes)
    if custom:
        raise RuntimeError(f"model {name} needs non-builtin ops {custom}; it would not train on a board")
    manifest["sha256"] = hashlib.sha256(model_bytes).hexdigest()
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / f"{name}.tflite"
    manifest_path = out_dir / f"{name}.json"
    model_path.write_bytes(model_bytes)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return model_path, manifest_path
