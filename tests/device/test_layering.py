"""The layers, declared as import-linter contracts in pyproject.toml: covey/ on top of
server/ on top of models/ on top of device/, nothing on a board (device/) importing
TensorFlow or the server's libraries, and no import cycles. Plus what a static graph
cannot show: importing the device runtime loads no TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEVICE = REPO / "device"


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


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
