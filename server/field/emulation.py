"""Running ARM programs on this machine: qemu-user through the kernel's binfmt_misc.

A board's root filesystem (:mod:`server.field.boards`) holds ARM binaries. The kernel
runs them through Debian's ``qemu-user-static`` once binfmt_misc knows the ARM ELF
headers. :class:`Binfmt` mounts binfmt_misc where it is not mounted and registers the
interpreters it lacks, from the files ``qemu-user-static`` installs in
``/usr/lib/binfmt.d`` (their ``F`` flag makes the kernel open the interpreter at
registration, so it works inside a chroot that holds no qemu), and undoes exactly what
it did when it closes. Registrations this machine already had are left alone.

qemu-user before version 8 shows a guest the host's own ``/proc/cpuinfo``. LiteRT's
XNNPACK reads it on ARM to pick its kernels, finds no ARM CPU in an x86 one, and the
interpreter segfaults as it starts (seen with qemu 7.2, Debian bookworm's, and
ai-edge-litert 2.3.0 on arm64). :func:`needs_cpuinfo` says when a board must be shown
an ARM ``cpuinfo`` (:data:`CPUINFO`, bind-mounted over the guest's), as a real Pi has.

Needs root and Debian's ``qemu-user-static``; :func:`available` says whether this
machine can, and why not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from device.errors import ConfigError
from server.field.lifecycle import OpenClose

BoardArch = Literal["arm64", "armhf"]
BINFMT = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONFIGS = Path("/usr/lib/binfmt.d")


@dataclass(frozen=True)
class ArchSpec:
    """How one Debian architecture runs here: its qemu, the CPU it emulates, what a
    board of it reports."""

    debian: BoardArch
    qemu: str  # binfmt entry and binary: qemu-<qemu>, qemu-<qemu>-static
    cpu: str  # QEMU_CPU: the board's core
    machine: str  # what `uname -m` says on such a board
    board: str  # the board this stands for


ARCHES: dict[BoardArch, ArchSpec] = {
    # A Raspberry Pi 4/5 with 64-bit Raspberry Pi OS (Cortex-A72 on the Pi 4)
    "arm64": ArchSpec("arm64", "aarch64", "cortex-a72", "aarch64", "Raspberry Pi 4, 64-bit OS"),
    # A Raspberry Pi 2/3/Zero 2 W with 32-bit Raspberry Pi OS (a Cortex-A7 on the Pi 2)
    "armhf": ArchSpec("armhf", "arm", "cortex-a7", "armv7l", "Raspberry Pi 2, 32-bit OS"),
}

# What /proc/cpuinfo says on the boards above (two of their four cores).
_A72 = (
    "processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n"
)
_A7 = (
    "processor\t: {n}\nmodel name\t: ARMv7 Processor rev 5 (v7l)\nBogoMIPS\t: 38.40\n"
    "Features\t: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm\n"
    "CPU implementer\t: 0x41\nCPU architecture: 7\nCPU variant\t: 0x0\nCPU part\t: 0xc07\nCPU revision\t: 5\n\n"
)
CPUINFO: dict[BoardArch, str] = {
    "arm64": "".join(_A72.format(n=n) for n in range(2)) + "Model\t\t: Raspberry Pi 4 Model B (emulated)\n",
    "armhf": "".join(_A7.format(n=n) for n in range(2)) + "Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 2 (emulated)\n",
}


def qemu_binary(arch: BoardArch) -> Path | None:
    """The static qemu-user for ``arch``, or None where it is not installed."""
    found = shutil.which(f"qemu-{ARCHES[arch].qemu}-static")
    return Path(found) if found else None


def qemu_version(arch: BoardArch) -> tuple[int, int]:
    """(major, minor) of the installed qemu-user for ``arch``."""
    binary = qemu_binary(arch)
    if binary is None:
        raise ConfigError(f"qemu-{ARCHES[arch].qemu}-static is missing; install qemu-user-static (apt)")
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    if match is None:
        raise ConfigError(f"cannot read the version of {binary}: {out.strip()[:200]!r}")
    return int(match.group(1)), int(match.group(2))


def needs_cpuinfo(arch: BoardArch) -> bool:
    """Whether a guest must be shown an ARM /proc/cpuinfo (qemu-user < 8 passes the host's)."""
    return qemu_version(arch) < (8, 0)


def available() -> tuple[bool, str]:
    """Whether emulated boards can run here, and the reason when not."""
    if os.geteuid() != 0:
        return False, "emulated boards need root (chroot, mounts, binfmt_misc)"
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("chroot", "coreutils"), ("tar", "tar")):
        if shutil.which(tool) is None:
            return False, f"{tool} is missing; install {package} (apt; ./dev test does)"
    for arch in ARCHES:
        if qemu_binary(arch) is None:
            return False, f"qemu-{ARCHES[arch].qemu}-static is missing; install qemu-user-static (apt; ./dev test does)"
        config = BINFMT_CONFIGS / f"qemu-{ARCHES[arch].qemu}.conf"
        if not config.exists():
            return False, f"{config} is missing (Debian's qemu-user-static has it)"
    return True, ""


class Binfmt(OpenClose):
    """binfmt_misc set up for ARM binaries while open; undone on :meth:`close`.

    Use as a context manager. Only what this object mounted or registered is undone.
    """

    def __init__(self, arches: tuple[BoardArch, ...] = ("arm64", "armhf")) -> None:
        self.arches = arches
        self._mounted = False
        self._registered: list[str] = []

    def open(self) -> None:
        if not (BINFMT / "register").exists():
            proc = subprocess.run(
                ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True, timeout=30
            )
            if proc.returncode != 0:
                raise ConfigError(f"cannot mount binfmt_misc: {proc.stderr.strip()}")
            self._mounted = True
        for arch in self.arches:
            name = f"qemu-{ARCHES[arch].qemu}"
            entry = BINFMT / name
            if entry.exists():
                text = entry.read_text()
                if "enabled" not in text.splitlines()[0]:
                    raise ConfigError(f"{entry} is registered but disabled; enable it (echo 1 > {entry})")
                flags = re.search(r"^flags: *(\S*)", text, re.M)
                if flags is None or "F" not in flags.group(1):
                    raise ConfigError(
                        f"{entry} lacks the F flag, so a chroot cannot find its interpreter; "
                        "register Debian's qemu-user-static (its binfmt.d files have it)"
                    )
                continue
            line = (BINFMT_CONFIGS / f"{name}.conf").read_text().splitlines()[0]
            with open(BINFMT / "register", "w") as register:
                register.write(line)
            self._registered.append(name)

    def close(self) -> None:
        for name in reversed(self._registered):
            try:
                with open(BINFMT / name, "w") as entry:
                    entry.write("-1")
            except OSError:
                pass
        self._registered.clear()
        if self._mounted:
            subprocess.run(["umount", str(BINFMT)], capture_output=True, timeout=30)
            self._mounted = False
