"""The tflite-runtime interpreter path, in its own environment (numpy < 2).

``./dev test`` builds ``.venv-tflite`` and exports its python as
``COVEY_TFLITE_RUNTIME_PYTHON``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import numpy as np
from device.runtime import TFLiteModel
m = TFLiteModel(sys.argv[1], backend="tflite_runtime")
rng = np.random.default_rng(0)
w = rng.normal(size=(60, 10)); x = rng.normal(size=(400, 60)).astype(np.float32); y = (x @ w).argmax(1)
before = m.evaluate(x, y)
r = m.train(x, y, epochs=5, batch_size=10, lr=0.05, seed=0)
after = m.evaluate(x, y)
flat = m.get_weights(); m.set_weights(flat)
print(json.dumps({"backend": m.backend.name, "version": m.backend.version, "numpy": np.__version__,
                  "before": before.loss, "after": after.loss, "acc": after.accuracy,
                  "exact": bool((m.get_weights() == flat).all())}))
"""


@pytest.mark.tflite_runtime
def test_device_runtime_trains_under_tflite_runtime(zoo_model) -> None:
    python = os.environ.get("COVEY_TFLITE_RUNTIME_PYTHON")
    assert python, "COVEY_TFLITE_RUNTIME_PYTHON is not set: run the suite with `./dev test`"
    model = zoo_model("mclr_synthetic")

    out = subprocess.run(
        [python, "-c", SCRIPT, str(model)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )

    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["backend"] == "tflite_runtime"
    assert result["numpy"].startswith("1.")
    assert result["after"] < result["before"] - 0.5
    assert result["acc"] > 0.7
    assert result["exact"]
