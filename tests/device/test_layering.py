"""The layers: device/ stands alone (no TensorFlow, no server/ or models/ imports), and
server/ never imports covey/ (the command line sits on top of everything)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEVICE = REPO / "device"
FORBIDDEN = {"tensorflow", "keras", "server", "models", "covey", "tf_keras"}


def _imports_under(folder: Path, forbidden: set[str]) -> list[str]:
    offenders = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in forbidden]
    return offenders


def test_no_module_under_device_imports_tensorflow_server_or_models() -> None:
    assert _imports_under(DEVICE, FORBIDDEN) == []


def test_no_module_under_server_imports_covey() -> None:
    assert _imports_under(REPO / "server", {"covey"}) == []


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
