"""models.quiet_tf: TensorFlow is imported when a model is built, not before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_layers_and_zoo_import_no_tensorflow() -> None:
    code = "import sys, models.zoo, models.layers; print('tensorflow' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "False\n"
