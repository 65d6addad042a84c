"""Emulated Raspberry Pi boards (server/field/boards.py): arm64 and armhf Debian bookworm
root filesystems run by qemu-user, with covey installed by firmware_scripts/install-device.sh.

The images are built once and cached under ``$COVEY_CACHE_DIR/boards`` (a cold build
takes 5-10 minutes per architecture); each session unpacks them, mounts what they need,
runs the install script again on the current source (the user's update path) and
removes everything afterwards, also when a test fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from server.field.boards import INSTALLS, EmulatedBoard, Install, cleanup_leftovers, ensure_image
from server.field.emulation import Binfmt, BoardArch, available

OK, WHY = available()  # the fixtures skip with WHY where boards cannot run (not root, no qemu)


@pytest.fixture(scope="session")
def binfmt() -> Iterator[Binfmt]:
    if not OK:
        pytest.skip(f"emulated boards unavailable: {WHY}")
    cleanup_leftovers()
    with Binfmt() as registered:
        yield registered


@pytest.fixture(scope="session")
def boards(binfmt: Binfmt) -> Iterator[Callable[[BoardArch], EmulatedBoard]]:
    """``boards(arch)``: that architecture's board, unpacked and mounted once per session."""
    started: dict[BoardArch, EmulatedBoard] = {}
    with contextlib.ExitStack() as stack:

        def board(arch: BoardArch) -> EmulatedBoard:
            if arch not in started:
                started[arch] = stack.enter_context(EmulatedBoard(arch, ensure_image(arch)))
            return started[arch]

        yield board


Installed = Callable[[BoardArch, str], tuple[EmulatedBoard, Install]]


@pytest.fixture(scope="session")
def installed(boards: Callable[[BoardArch], EmulatedBoard]) -> Installed:
    """``installed(arch, backend)``: the board with that install updated to the current source."""

    def get(arch: BoardArch, backend: str) -> tuple[EmulatedBoard, Install]:
        board = boards(arch)
        install = next(i for i in INSTALLS[arch] if i.backend == backend)
        board.refresh(install)
        return board, install

    return get
