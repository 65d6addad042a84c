"""firmware_scripts/termux-setup.sh: valid bash, and outside Termux it refuses with one
line and exit status 2 instead of running pkg against a Debian machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "firmware_scripts" / "termux-setup.sh"


def test_the_script_parses_and_refuses_to_run_outside_termux(tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}
    )
    assert proc.returncode == 2 and "this is not Termux" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
