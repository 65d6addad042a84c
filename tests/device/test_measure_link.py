"""``covey-device --measure-link`` and ``firmware_scripts/measure-link.sh``: what the
agent would report about its link, "not available" where the machine has no Wi-Fi."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from device.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_measure_link_on_a_machine_without_wifi_says_not_available(capsys) -> None:
    assert main(["--measure-link"]) == 0
    out = capsys.readouterr().out
    from device.link import read_wifi

    if read_wifi() is None:  # this CI machine: no wireless interface, no iw, no termux-api
        assert "Wi-Fi: not available" in out
    else:
        assert "interface:" in out and "signal:" in out
    assert "RTT and goodput" in out


@pytest.mark.slow
def test_the_script_runs_the_installed_agent(tmp_path: Path) -> None:
    # Prepare: an install prefix whose venv holds covey-device (this interpreter's)
    bin_dir = tmp_path / "prefix" / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    agent = bin_dir / "covey-device"
    agent.write_text(f'#!/bin/sh\nexec {sys.executable} -m device.cli "$@"\n')
    agent.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}

    # Execute
    found = subprocess.run(
        ["sh", str(REPO / "firmware_scripts" / "measure-link.sh"), str(tmp_path / "prefix")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    missing = subprocess.run(
        ["sh", str(REPO / "firmware_scripts" / "measure-link.sh"), str(tmp_path / "none")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )

    # Assert
    assert found.returncode == 0 and "covey link report" in found.stdout, found.stderr
    assert missing.returncode == 2 and "install-device.sh" in missing.stderr
    assert os.access(REPO / "firmware_scripts" / "measure-link.sh", os.X_OK)
