"""The interpreter's start-up banner stays off the terminal; nothing else written to
standard error meanwhile is lost (each case in a fresh process: the banner comes once
per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BANNER = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_a_model_s_first_use_prints_no_banner_on_standard_error(zoo_model) -> None:
    path = zoo_model("mlp_femnist")
    done = _run(
        "import numpy as np\n"
        "from device.runtime import TFLiteModel\n"
        f"m = TFLiteModel({str(path)!r}, num_threads=1)\n"
        "m.evaluate(np.zeros((4, 784), np.float32), np.zeros(4, np.int64))\n"
        "print('trained', flush=True)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout
    assert BANNER not in done.stderr, done.stderr


def test_what_else_reaches_standard_error_during_the_first_allocation_is_written_back() -> None:
    done = _run(
        "import os, sys\n"
        "from device.native_log import first_allocation\n"
        "def allocate(n):\n"
        f"    os.write(2, b'a real warning\\n{BANNER}\\nanother line\\n')\n"
        "    return n + 1\n"
        "assert first_allocation(allocate, 1) == 2\n"
        f"first_allocation(lambda: os.write(2, b'{BANNER}\\n'))\n"
        "print('stderr still works', file=sys.stderr)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["a real warning", "another line", BANNER, "stderr still works"]


def test_an_allocation_runs_as_it_is_when_there_is_nowhere_to_catch_the_banner(tmp_path) -> None:
    # Reviewed on 2026-11-27: with no temporary folder every allocation failed, and a
    # closed standard error failed each one too
    done = _run(
        "import os, sys, tempfile\n"
        "from device.native_log import first_allocation\n"
        f"tempfile.tempdir = {str(tmp_path / 'gone')!r}\n"
        "assert first_allocation(lambda n: n + 1, 1) == 2\n"
        "assert first_allocation(lambda n: n + 1, 2) == 3\n"
        "print('allocated', flush=True)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "allocated\n"
    closed = _run(
        "import os, sys\n"
        "sys.stderr = None\n"
        "os.close(2)\n"
        "from device.native_log import first_allocation\n"
        "assert first_allocation(lambda: 7) == 7\n"
        "print('allocated', flush=True)\n"
    )
    assert closed.returncode == 0 and closed.stdout == "allocated\n", closed
