"""firmware_scripts/install-device.sh on emulated boards: what it installs, and what it refuses.

The images were installed by the script (server/field/boards.py); each session runs it
again on the current source, the way a user updates a board. Here: the installed agent
answers ``--help`` on each board, and the script refuses, in one line and before
writing anything, what no wheel exists for: LiteRT on 32-bit ARM. (An ARMv6 board, a Pi 1
or Pi Zero, cannot be emulated with Debian's armhf, which needs ARMv7 instructions: bash
itself dies of an illegal instruction under qemu's arm1176; tests/firmware_scripts checks
that refusal with the machine name a Pi Zero reports.)
"""

from __future__ import annotations

import pytest

from server.field.boards import GUEST_SOURCE
from tests.boards.conftest import Installed

pytestmark = [pytest.mark.boards, pytest.mark.slow]
SCRIPT = f"{GUEST_SOURCE}/firmware_scripts/install-device.sh"


INSTALLS = [("arm64", "litert"), ("arm64", "tflite-runtime"), ("armhf", "tflite-runtime")]


@pytest.mark.parametrize(("arch", "backend"), INSTALLS)
def test_the_installed_agent_runs_on_the_board(installed: Installed, arch: str, backend: str) -> None:
    board, install = installed(arch, backend)  # type: ignore[arg-type]
    done = board.run([install.agent, "--help"], timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Run a covey device agent" in done.stdout


def test_the_32_bit_board_refuses_litert_in_one_line(installed: Installed) -> None:
    # Prepare
    board, _ = installed("armhf", "tflite-runtime")

    # Execute
    done = board.run(["bash", SCRIPT, "--backend", "litert", "/opt/refused"], timeout=300)

    # Assert
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "LiteRT has no wheels for armv7l" in done.stderr, done.stderr
    assert "--backend tflite-runtime" in done.stderr
    assert not board.path("/opt/refused").exists()
