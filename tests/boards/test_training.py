"""Every small zoo model trains on emulated Raspberry Pi boards as it does on x86.

The same model file, data, seed and steps on the board (its installed interpreter,
one thread) and here give the same losses up to float rounding: the board's own
install (LiteRT on 64-bit, tflite-runtime on 64-bit and on 32-bit) computes what
covey computes everywhere else. Before covey stopped resizing scalar inputs, LiteRT
segfaulted on arm64 at the first train step (issue 25).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from server.field.board_checks import SMALL_MODELS, compare_training
from tests.boards.conftest import Installed

pytestmark = [pytest.mark.boards, pytest.mark.slow]
# float32 training over 5 steps: different kernels (NEON vs AVX) round differently
LOSS_TOLERANCE = 1e-4


@pytest.mark.parametrize(
    ("arch", "backend", "machine", "interpreter"),
    [
        ("arm64", "litert", "aarch64", "ai_edge_litert"),
        ("arm64", "tflite-runtime", "aarch64", "tflite_runtime"),
        ("armhf", "tflite-runtime", "armv7l", "tflite_runtime"),
    ],
)
def test_every_small_model_trains_on_the_board_with_the_losses_of_x86(
    installed: Installed,
    zoo_model: Callable[[str], Path],
    tmp_path: Path,
    arch: str,
    backend: str,
    machine: str,
    interpreter: str,
) -> None:
    # Prepare: the board with its install updated to this source
    board, install = installed(arch, backend)  # type: ignore[arg-type]

    # Execute
    comparisons = compare_training(board, install, zoo_model, tmp_path)

    # Assert: each model trained on the ARM board, with its interpreter, to x86's losses
    assert sorted(c.model for c in comparisons) == sorted(SMALL_MODELS)
    for c in comparisons:
        assert c.board["machine"] == machine and c.board["backend"] == interpreter, c.board
        assert c.board["steps"] == 5 and c.host["steps"] == 5
        assert c.max_abs_loss_diff <= LOSS_TOLERANCE, (c.model, c.board, c.host)
        assert math.isfinite(c.board["loss_after"]) and 0 <= c.board["accuracy_after"] <= 1
