"""Emulated Raspberry Pi boards: Debian root filesystems for arm64 and armhf, run by qemu-user.

A board here is what a user's board is, minus the silicon: Debian bookworm (the base of
Raspberry Pi OS, 64-bit and 32-bit) built by ``mmdebstrap`` from Debian's archive, with
covey installed by the board's own ``firmware_scripts/install-device.sh`` from a copy
of this repository, and its programs run by qemu-user (:mod:`server.field.emulation`)
in a ``chroot`` that shares this machine's network: the board reaches a broker on
loopback as a board on the LAN reaches the broker host. Emulation proves that covey
installs and computes correctly on ARM, not how fast a board is.

:func:`ensure_image` builds an image once and caches it as a tarball under
``<cache>/boards``, keyed by a hash of what goes into it (the Debian release, the
packages, ``pyproject.toml`` and the install script); a cold build takes 5-10 minutes
per architecture here, a warm start 2-5 seconds to unpack. :class:`EmulatedBoard`
unpacks an image into a fresh folder, mounts what a running system needs (``proc``,
``sys``, a private ``devpts``, ``/dev/shm``, and an ARM ``cpuinfo`` where the qemu
needs it: :mod:`server.field.board_mounts`), and on :meth:`EmulatedBoard.refresh` runs the install script again on the
current source, which is how a user updates a board. :meth:`EmulatedBoard.close` kills
what it started, unmounts, and deletes the folder only once nothing is mounted in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from device.errors import ConfigError
from server.field.board_mounts import mounted, remove_tree, run_checked
from server.field.emulation import ARCHES, BoardArch
from server.field.lifecycle import OpenClose
from server.paths import REPO_ROOT, cache_dir

Backend = Literal["litert", "tflite-runtime"]
RELEASE = "bookworm"
# Bump when the recipe below changes what an image holds.
RECIPE = "1"
# The Debian suites: main and updates. Not bookworm-security: its index changes daily and a
# mirror in the middle of a sync fails `apt-get update` ("File has unexpected size"; seen
# for armhf here), and what the images test (covey's install and numerics) needs none of it.
SOURCES = (
    f"deb http://deb.debian.org/debian {RELEASE} main",
    f"deb http://deb.debian.org/debian {RELEASE}-updates main",
)
PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
GUEST_SOURCE = "/root/covey"  # where the board's copy of the repository lies
BOARD_TMP_PREFIX = "covey-board-"


@dataclass(frozen=True)
class Install:
    """One ``install-device.sh`` run on a board: its prefix and backend."""

    prefix: str
    backend: Backend

    @property
    def agent(self) -> str:
        return f"{self.prefix}/venv/bin/covey-device"

    @property
    def python(self) -> str:
        return f"{self.prefix}/venv/bin/python"


# What each image holds. arm64: the default install (LiteRT) and a tflite-runtime one;
# armhf: tflite-runtime, the only interpreter with 32-bit ARM wheels (over Debian's numpy).
INSTALLS: dict[BoardArch, tuple[Install, ...]] = {
    "arm64": (Install("/opt/covey", "litert"), Install("/opt/covey-tflite", "tflite-runtime")),
    "armhf": (Install("/opt/covey", "tflite-runtime"),),
}


def _say(message: str) -> None:
    print(f"boards: {message}", file=sys.stderr, flush=True)


def guest_env(arch: BoardArch, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for a board's programs (nothing of this machine's leaks in)."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "QEMU_CPU": ARCHES[arch].cpu,  # read by qemu-user: the board's core
        **(extra or {}),
    }


def source_files(repo: Path = REPO_ROOT) -> list[str]:
    """The repository's files as a user's copy holds them: tracked and new, not ignored."""
    out = run_checked(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        timeout=60,
        what="listing the repository's files",
    )
    return sorted(f for f in out.split("\0") if f and (repo / f).is_file())


def copy_source(root: Path, repo: Path = REPO_ROOT) -> None:
    """A fresh copy of the repository at :data:`GUEST_SOURCE` inside ``root``."""
    dest = root / GUEST_SOURCE.lstrip("/")
    shutil.rmtree(dest, ignore_errors=True)
    for name in source_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)


BOARD_EXTRAS = ("agent", "device", "device-tflite")  # what install-device.sh may install


def image_key(arch: BoardArch, repo: Path = REPO_ROOT) -> str:
    """What an image is built from, hashed: change any of it and the image is rebuilt.

    Of ``pyproject.toml`` only what pip installs on a board counts (the build system,
    the dependencies, the extras a board installs and the Python range), not tool
    settings such as test markers, nor the server's or the developers' extras.
    """
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    extras = project["project"].get("optional-dependencies", {})
    installs_from = {
        "build-system": project.get("build-system"),
        **{k: project["project"].get(k) for k in ("requires-python", "dependencies")},
        "optional-dependencies": {name: extras.get(name) for name in BOARD_EXTRAS},
    }
    digest = hashlib.sha256()
    for part in (RECIPE, RELEASE, arch, *SOURCES, *PACKAGES, repr(INSTALLS[arch])):
        digest.update(part.encode() + b"\0")
    digest.update(json.dumps(installs_from, sort_keys=True).encode())
    digest.update((repo / "firmware_scripts" / "install-device.sh").read_bytes())
    return digest.hexdigest()[:16]


def image_path(arch: BoardArch, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "boards" / f"{RELEASE}-{arch}-{image_key(arch)}.tar"


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One builder per image at a time (two test sessions would build it twice)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_image(arch: BoardArch, cache: Path | None = None, *, say: Callable[[str], None] = _say) -> Path:
    """The cached image of ``arch`` (a tarball of its root filesystem), built if missing.

    Old images of ``arch`` (other keys) are deleted once the new one is in place.
    """
    path = image_path(arch, cache)
    with _lock(path.with_suffix(".lock")):
        if path.exists():
            return path
        started = time.monotonic()
        say(f"building the {arch} board image ({RELEASE}, mmdebstrap then install-device.sh; 5-10 minutes)")
        work = Path(tempfile.mkdtemp(prefix=f"{BOARD_TMP_PREFIX}build-{arch}-", dir=path.parent))
        (work / "owner.pid").write_text(str(os.getpid()))
        try:
            root = work / "root"
            _debootstrap(arch, root, say)
            with mounted(arch, root):
                _prepare(arch, root, say)
                for install in INSTALLS[arch]:
                    say(f"{arch}: install-device.sh --backend {install.backend} {install.prefix}")
                    run_install(arch, root, install)
            run_checked(["rm", "-rf", str(root / "root" / ".cache")], timeout=120, what="removing pip's cache")
            partial = path.with_suffix(".tar.partial")
            run_checked(
                ["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], timeout=900, what="packing"
            )
            partial.rename(path)
        finally:
            remove_tree(work)
        for old in path.parent.glob(f"{RELEASE}-{arch}-*.tar"):
            if old != path:
                old.unlink(missing_ok=True)
        size = path.stat().st_size / 2**20
        say(f"{arch} image ready in {time.monotonic() - started:.0f} s: {path} ({size:.0f} MB)")
        return path


def _debootstrap(arch: BoardArch, root: Path, say: Callable[[str], None]) -> None:
    packages = [*PACKAGES, *(("python3-numpy",) if arch == "armhf" else ())]
    argv = ["mmdebstrap", f"--arch={arch}", "--variant=apt", f"--include={','.join(packages)}", RELEASE, str(root)]
    for attempt in range(3):  # a mirror in the middle of a sync fails apt-get update for a while
        try:
            run_checked([*argv, *SOURCES], timeout=1800, what=f"mmdebstrap ({arch})")
            return
        except ConfigError as exc:
            if attempt == 2:
                raise
            say(f"{arch}: mmdebstrap failed, trying again in 30 s: {str(exc).splitlines()[-1]}")
            remove_tree(root)
            time.sleep(30)


def _prepare(arch: BoardArch, root: Path, say: Callable[[str], None]) -> None:
    """What a freshly flashed board has: host names, and the CAs this machine trusts."""
    hosts = root / "etc" / "hosts"
    if not hosts.exists() or "localhost" not in hosts.read_text():
        hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n")
    (root / "etc" / "hostname").write_text(f"pi-{arch}\n")
    # pip on the board must trust what this machine trusts (a proxy's CA on some networks)
    extra = Path("/usr/local/share/ca-certificates")
    if extra.is_dir() and any(extra.glob("*.crt")):
        say(f"{arch}: adding this machine's extra CA certificates")
        for cert in extra.glob("*.crt"):
            shutil.copy2(cert, root / "usr" / "local" / "share" / "ca-certificates" / cert.name)
        run_checked(chroot_argv(arch, root, ["update-ca-certificates"]), timeout=600, what="update-ca-certificates")


def chroot_argv(arch: BoardArch, root: Path, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` as run on the board at ``root``, in a clean environment."""
    pairs = [f"{k}={v}" for k, v in guest_env(arch, env).items()]
    return ["chroot", str(root), "/usr/bin/env", "-i", *pairs, *argv]


def run_install(arch: BoardArch, root: Path, install: Install) -> str:
    """``install-device.sh --backend B PREFIX`` on the board, from its copy of the repository."""
    _sync_resolver(root)
    copy_source(root)
    script = f"{GUEST_SOURCE}/firmware_scripts/install-device.sh"
    argv = ["bash", script, "--backend", install.backend, install.prefix]
    return run_checked(chroot_argv(arch, root, argv), timeout=1800, what=f"install-device.sh on the {arch} board")


def _sync_resolver(root: Path) -> None:
    """The board resolves names as this machine does (pip reaches the package index)."""
    target = root / "etc" / "resolv.conf"
    if target.is_symlink():
        target.unlink()
    with contextlib.suppress(OSError):
        shutil.copy2("/etc/resolv.conf", target)


def cleanup_leftovers(cache: Path | None = None) -> list[Path]:
    """Boards and image builds an earlier, killed session left behind (their owner
    process is gone): unmounted and deleted. Returns what was removed."""
    removed = []
    bases = (Path(tempfile.gettempdir()), (cache or cache_dir()) / "boards")
    for folder in (f for base in bases for f in base.glob(f"{BOARD_TMP_PREFIX}*")):
        owner = folder / "owner.pid"
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(ConfigError):
            remove_tree(folder)
            removed.append(folder)
    return removed


class EmulatedBoard(OpenClose):
    """A running emulated board: an image unpacked, mounted, and its programs.

    Use as a context manager (after :class:`server.field.emulation.Binfmt` is open).
    ``path(guest)`` is where a guest path lies on this machine, so files are copied in
    and out with plain file operations.
    """

    def __init__(self, arch: BoardArch, image: Path) -> None:
        self.arch, self.image = arch, image
        self.folder: Path | None = None
        self._mounts: contextlib.ExitStack | None = None
        self._processes: list[subprocess.Popen[bytes]] = []
        self._refreshed: set[Install] = set()

    @property
    def root(self) -> Path:
        if self.folder is None:
            raise ConfigError("the board is not running: use it inside `with EmulatedBoard(...)`")
        return self.folder / "root"

    def open(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=f"{BOARD_TMP_PREFIX}{self.arch}-"))
        (self.folder / "owner.pid").write_text(str(os.getpid()))  # for cleanup_leftovers
        self.root.mkdir()
        run_checked(
            ["tar", "-C", str(self.root), "--numeric-owner", "-xf", str(self.image)], timeout=600, what="unpack"
        )
        self._mounts = contextlib.ExitStack()
        self._mounts.enter_context(mounted(self.arch, self.root))

    def path(self, guest: str) -> Path:
        """This machine's path of the board's ``guest`` path."""
        return self.root / guest.lstrip("/")

    def argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        return chroot_argv(self.arch, self.root, argv, env)

    def run(
        self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the board and wait (at most ``timeout`` seconds)."""
        return subprocess.run(self.argv(argv, env), capture_output=True, text=True, timeout=timeout)

    def start(
        self, argv: Sequence[str], log: IO[bytes], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on the board, output to ``log``; stopped by :meth:`stop_all`."""
        proc = subprocess.Popen(self.argv(argv, env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._processes.append(proc)
        return proc

    def refresh(self, install: Install) -> str:
        """Run ``install-device.sh`` again on the current source (once per board and
        install): the user's update path, so the board runs the code under test."""
        if install in self._refreshed:
            return ""
        out = run_install(self.arch, self.root, install)
        self._refreshed.add(install)
        return out

    def stop_all(self, timeout: float = 15.0) -> None:
        """SIGTERM (as systemd stops a service) every process started here, then SIGKILL."""
        for proc in self._processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self._processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._processes.clear()

    def close(self) -> None:
        self.stop_all()
        if self._mounts is not None:
            self._mounts.close()
            self._mounts = None
        if self.folder is not None:
            remove_tree(self.folder)
            self.folder = None
