"""A newcomer's first commands: no TensorFlow where none is needed, and no TensorFlow
banners on the terminal when a model has to be built.

Each test runs the real command in a subprocess from the repository root, with
``TF_CPP_MIN_LOG_LEVEL`` unset, as a user's shell has it (the suite's conftest sets it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What TensorFlow 2.x writes to stderr on import (absl's pre-init notice, oneDNN, CPU
# features); the XNNPACK line of the LiteRT interpreter is not TensorFlow's.
TF_BANNERS = ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard", "TensorFlow binary is optimized")

SIMULATE = ["simulate", "--strategy", "fedavg", "--dataset", "synthetic", "--data", "users=10", "--rounds", "2"]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def _banners(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(b in line for b in TF_BANNERS)]


def _tensorflow_loaded_after(argv: list[str], env: dict[str, str]) -> bool:
    """Run ``covey ARGV`` in a fresh interpreter; whether it imported TensorFlow."""
    code = (
        "import sys\n"
        "from covey.cli import main\n"
        f"status = main({argv!r})\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules, flush=True)\n"
        "sys.exit(status)\n"
    )
    proc = _run([sys.executable, "-c", code], env)
    assert proc.returncode == 0, proc.stderr
    assert not _banners(proc.stderr), proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("tensorflow imported: "), proc.stdout
    return last.endswith("True")


def test_model_list_prints_the_table_without_tensorflow() -> None:
    from models.zoo import ZOO

    proc = _run([sys.executable, "-m", "covey", "model", "list"], _env())

    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no banner, nothing at all
    rows = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()[1:]}
    assert rows == {name: f"{arch.n_params:,}" for name, arch in ZOO.items()}
    assert not _tensorflow_loaded_after(["model", "list"], _env())


@pytest.mark.slow
def test_simulate_builds_a_model_quietly_and_then_runs_without_tensorflow(tmp_path: Path) -> None:
    # Prepare: an empty model cache, so the first run builds its model with TensorFlow
    env = _env(COVEY_CACHE_DIR=str(tmp_path / "cache"))

    # Execute: the first run builds mclr_synthetic, the second finds it cached
    first = _run([sys.executable, "-m", "covey", *SIMULATE, "--out", str(tmp_path / "first")], env)
    imported = _tensorflow_loaded_after([*SIMULATE, "--out", str(tmp_path / "second")], env)

    # Assert
    assert first.returncode == 0, first.stderr
    assert not _banners(first.stderr), first.stderr
    assert list((tmp_path / "cache" / "zoo").glob("*/mclr_synthetic.tflite"))
    assert not imported
