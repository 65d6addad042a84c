"""A board's root filesystem on this machine: what a running system needs mounted into
it (and out again, even on failure), and its deletion, which never goes through a
mount. Used by the emulated boards (:mod:`server.field.boards`)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from device.errors import ConfigError
from server.field.emulation import CPUINFO, BoardArch, needs_cpuinfo


def run_checked(argv: Sequence[str], *, timeout: float, what: str, env: Mapping[str, str] | None = None) -> str:
    """Run ``argv``; its output, or a :class:`ConfigError` with the last lines it printed."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ConfigError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def mounts_under(root: Path) -> list[Path]:
    """Mount points inside ``root`` (deepest first), from this process's mount table."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo") as table:
        for line in table:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(Path(point))
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def unmount_all(root: Path) -> None:
    for point in mounts_under(root):
        done = subprocess.run(["umount", str(point)], capture_output=True, timeout=60)
        if done.returncode != 0:  # still busy: detach it now, the kernel frees it when idle
            subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=60)


def remove_tree(folder: Path) -> None:
    """Delete ``folder``, but never through a mount: unmount first, refuse if that failed."""
    if not folder.exists():
        return
    unmount_all(folder)
    left = mounts_under(folder)
    if left:
        raise ConfigError(f"cannot delete {folder}: still mounted at {', '.join(map(str, left))}")
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def mounted(arch: BoardArch, root: Path) -> Iterator[None]:
    """``proc``, ``sys``, a private ``devpts``, ``/dev/shm`` and, where qemu needs it, an
    ARM ``cpuinfo`` mounted into ``root``; all unmounted afterwards, even on failure."""
    try:
        for fstype, where, options in (
            ("proc", "proc", ""),
            ("sysfs", "sys", "ro"),
            ("devpts", "dev/pts", "newinstance,ptmxmode=0666"),
            ("tmpfs", "dev/shm", "mode=1777"),
        ):
            point = root / where
            point.mkdir(parents=True, exist_ok=True)
            argv = ["mount", "-t", fstype, *(["-o", options] if options else []), fstype, str(point)]
            run_checked(argv, timeout=30, what=f"mounting {where}")
        if needs_cpuinfo(arch):
            # qemu-user < 8 shows the guest this machine's x86 cpuinfo; XNNPACK then
            # segfaults at interpreter start (server/field/emulation.py)
            fake = root / "run" / "covey-cpuinfo"
            fake.parent.mkdir(parents=True, exist_ok=True)
            fake.write_text(CPUINFO[arch])
            run_checked(
                ["mount", "--bind", str(fake), str(root / "proc" / "cpuinfo")], timeout=30, what="mounting cpuinfo"
            )
        yield
    finally:
        unmount_all(root)
