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
                  "exact": bool((m.get_weights() == flat).all()),
                  "flat_signature": bool((m._runner("get_weights")()["weights"] == flat).all())}))
"""


def _in_tflite_runtime_env(script: str, *args: str) -> dict:  # type: ignore[type-arg]
    """Run ``script`` with the numpy<2 tflite-runtime python; its last line is JSON."""
    python = os.environ.get("COVEY_TFLITE_RUNTIME_PYTHON")
    assert python, "COVEY_TFLITE_RUNTIME_PYTHON is not set: run the suite with `./dev test`"
    out = subprocess.run(
        [python, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.tflite_runtime
def test_device_runtime_trains_under_tflite_runtime(zoo_model) -> None:
    model = zoo_model("mclr_synthetic")

    result = _in_tflite_runtime_env(SCRIPT, str(model))

    assert result["backend"] == "tflite_runtime"
    assert result["numpy"].startswith("1.")
    assert result["after"] < result["before"] - 0.5
    assert result["acc"] > 0.7
    assert result["exact"]
    assert result["flat_signature"]  # get_weights read per tensor through views agrees


ARTIFACT_SCRIPT = """
import json, sys
import numpy as np
from device.runtime import TFLiteModel
m = TFLiteModel(sys.argv[1], backend="tflite_runtime")
start = np.load(sys.argv[2])
rng = np.random.default_rng(0)
w = rng.normal(size=(60, 10)); x = rng.normal(size=(400, 60)).astype(np.float32); y = (x @ w).argmax(1)
r = m.train(x, y, epochs=5, batch_size=10, lr=0.05, seed=0, initial_weights=start)
print(json.dumps({"first": r.mean_loss, "after": m.evaluate(x, y).loss, "acc": m.evaluate(x, y).accuracy}))
"""


@pytest.mark.tflite_runtime
def test_the_device_artifact_trains_under_tflite_runtime(zoo_model, tmp_path: Path) -> None:
    # Prepare: the stripped model a board downloads, and start weights from the server
    import numpy as np

    from device.runtime import TFLiteModel
    from server.artifact import write_device_artifact

    model = zoo_model("mclr_synthetic")
    artifact = write_device_artifact(model, tmp_path / "device")
    np.save(tmp_path / "start.npy", TFLiteModel(model).get_weights())

    # Execute
    result = _in_tflite_runtime_env(ARTIFACT_SCRIPT, str(artifact), str(tmp_path / "start.npy"))

    # Verify
    assert result["after"] < result["first"] - 0.5
    assert result["acc"] > 0.7


ACCUMULATE_SCRIPT = """
import json, sys
import numpy as np
from device.runtime import TFLiteModel
m = TFLiteModel(sys.argv[1], backend="tflite_runtime")
start = np.load(sys.argv[2])
rng = np.random.default_rng(3)
x = rng.random((64, 784), dtype=np.float32); y = rng.integers(0, 10, 64)
chunked = m.train(x, y, batch_size=32, lr=0.1, seed=1, initial_weights=start)
whole = m.train(x, y, batch_size=32, lr=0.1, seed=1, initial_weights=start, accumulate=False)
np.save(sys.argv[3], chunked.weights)
print(json.dumps({"rel": float(np.linalg.norm(chunked.weights - whole.weights) / np.linalg.norm(whole.weights))}))
"""


@pytest.mark.slow
@pytest.mark.tflite_runtime
def test_accumulated_training_runs_under_tflite_runtime(zoo_model, tmp_path: Path) -> None:
    """The MNIST CNN's device artifact at batch 32 trains through accumulate and
    apply_accumulated on a board's interpreter, as the whole-batch step would, and as
    LiteRT does."""
    # Prepare
    import numpy as np

    from device.runtime import TFLiteModel
    from server.artifact import write_device_artifact

    model = zoo_model("cnn_mnist")
    artifact = write_device_artifact(model, tmp_path / "device")
    start = TFLiteModel(model).get_weights()
    np.save(tmp_path / "start.npy", start)

    # Execute
    result = _in_tflite_runtime_env(
        ACCUMULATE_SCRIPT, str(artifact), str(tmp_path / "start.npy"), str(tmp_path / "chunked.npy")
    )
    rng = np.random.default_rng(3)  # the script's data
    x = rng.random((64, 784), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    litert = TFLiteModel(artifact).train(x, y, batch_size=32, lr=0.1, seed=1, initial_weights=start)

    # Verify
    chunked = np.load(tmp_path / "chunked.npy")
    assert result["rel"] < 1e-5
    assert np.linalg.norm(chunked - litert.weights) / np.linalg.norm(litert.weights) < 1e-5
    assert np.linalg.norm(chunked - start) > 0
