"""models.quiet_tf: TensorFlow's import banners are dropped, everything else passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_only_the_banners_are_dropped() -> None:
    # Written to descriptor 2 inside the guard, as TensorFlow's C++ code writes
    code = (
        "import os\n"
        "from models.quiet_tf import _without_banners\n"
        "with _without_banners():\n"
        "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are written')\n"
        "    os.write(2, b' to STDERR\\n')\n"
        "    os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on. You may see ...\\n')\n"
        "    os.write(2, b'something the user must see\\n')\n"
        "os.write(2, b'after\\n')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "something the user must see\nafter\n"


def test_layers_and_zoo_import_no_tensorflow() -> None:
    code = "import sys, models.zoo, models.layers; print('tensorflow' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "False\n"
