"""device/ stands alone: no TensorFlow, no server/ or models/ imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

DEVICE = Path(__file__).resolve().parents[2] / "device"
FORBIDDEN = {"tensorflow", "keras", "server", "models", "covey", "tf_keras"}


def test_no_module_under_device_imports_tensorflow_server_or_models() -> None:
    offenders = []
    for path in DEVICE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_importing_the_device_runtime_loads_no_tensorflow() -> None:
    code = (
        "import sys, device.runtime, device.data, device.manifest\n"
        "m = device.runtime.find_backend()\n"
        "print(m.name, 'tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=DEVICE.parent,
    ).stdout.split()
    assert out == ["ai_edge_litert", "False"]
