"""Under ``-v``, log records start lines of their own and never run into a progress bar.

A tqdm bar redraws its line with a carriage return and no newline; a terminal shows
what follows a ``\\r`` or a ``\\n`` at the start of a line. So the captured stderr is
cut at both, and every piece that holds a log record must begin with it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
BAR = re.compile(r"\d+%\|")


@pytest.mark.parametrize("worker_kind", ["thread", "process"])
def test_log_records_never_share_a_line_with_a_bar(tmp_path: Path, worker_kind: str) -> None:
    argv = ["-v", "simulate", "--strategy", "fedavg", "--dataset", "synthetic", "--data", "users=10", "--rounds", "2"]
    argv += ["--workers", "2", "--worker-kind", worker_kind, "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}

    proc = subprocess.run(
        [sys.executable, "-m", "covey", *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )

    assert proc.returncode == 0, proc.stderr
    pieces = re.split(r"[\r\n]", proc.stderr)
    records = [p for p in pieces if RECORD.search(p)]
    assert records and any(BAR.search(p) for p in pieces)  # a bar was shown and something was logged
    glued = [p for p in records if not RECORD.match(p) or BAR.search(p)]
    assert not glued, glued
