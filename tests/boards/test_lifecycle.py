"""The emulated boards' set-up is undone: binfmt_misc as it was, no mount left, no folder left."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from server.field import board_mounts, boards
from server.field.emulation import ARCHES, BINFMT, Binfmt
from tests.boards.conftest import OK, WHY

pytestmark = [pytest.mark.boards, pytest.mark.skipif(not OK, reason=f"emulated boards unavailable: {WHY}")]


def _binfmt_state() -> tuple[bool, set[str]]:
    mounted = (BINFMT / "register").exists()
    entries = {f"qemu-{a.qemu}" for a in ARCHES.values() if mounted and (BINFMT / f"qemu-{a.qemu}").exists()}
    return mounted, entries


def test_binfmt_registers_the_arm_interpreters_and_leaves_the_machine_as_it_found_it() -> None:
    # Prepare
    before = _binfmt_state()

    # Execute
    with Binfmt():
        inside = _binfmt_state()
        uname = subprocess.run(["qemu-aarch64-static", "--version"], capture_output=True, text=True, timeout=30)
    after = _binfmt_state()

    # Assert
    assert inside == (True, {"qemu-aarch64", "qemu-arm"})
    assert uname.returncode == 0
    assert after == before


def test_a_folder_is_deleted_only_once_nothing_is_mounted_in_it(tmp_path: Path) -> None:
    # Prepare: a tmpfs mounted inside the folder, as a board's /dev/shm is
    folder = tmp_path / "board"
    (folder / "root" / "dev" / "shm").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(folder / "root" / "dev" / "shm")], check=True, timeout=30)
    (folder / "root" / "dev" / "shm" / "kept").write_text("x")

    # Execute
    board_mounts.remove_tree(folder)

    # Assert: unmounted, then deleted
    assert not folder.exists()
    assert not board_mounts.mounts_under(tmp_path)


def test_leftovers_of_a_dead_session_are_removed_and_a_live_one_is_kept(tmp_path: Path) -> None:
    # Prepare: a board folder whose owner has exited (with a mount in it), and one of this process
    dead = Path(tempfile.mkdtemp(prefix=f"{boards.BOARD_TMP_PREFIX}test-dead-"))
    live = Path(tempfile.mkdtemp(prefix=f"{boards.BOARD_TMP_PREFIX}test-live-"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (dead / "owner.pid").write_text(gone.stdout.strip())
    (live / "owner.pid").write_text(str(os.getpid()))
    (dead / "proc").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(dead / "proc")], check=True, timeout=30)
    try:
        # Execute
        removed = boards.cleanup_leftovers(tmp_path / "cache")

        # Assert
        assert dead in removed and not dead.exists()
        assert live.exists() and live not in removed
    finally:
        board_mounts.remove_tree(dead)
        board_mounts.remove_tree(live)
