"""The site folder: where each file lives, who owns it, and ``site.toml``.

::

    DIR/site.toml              what the site is (read by add-device, server run --site, broker run --site)
    DIR/ca/ca.crt, ca.key      the site's CA; the key never leaves this folder
    DIR/broker/                what mosquitto reads: mosquitto.conf, ca.crt, broker.crt, broker.key,
                               passwords, acl, and data/ (persistence, unless installed system-wide)
    DIR/coordinator/           the coordinator's credentials: password, ca.crt [, client.crt, client.key]
    DIR/devices/<ID>/          one bundle per board: device.toml, ca.crt, password [, client.crt, client.key]

**Who owns what.** mosquitto started as root (the systemd service, or ``covey broker
run`` as root) drops to the ``mosquitto`` user before it reads its certificate, key,
password file and ACL. So when ``covey site init`` runs as root, ``broker/`` and its
secret files are group-owned by ``mosquitto`` with mode 0640 (0750 for the folder),
``broker/data`` belongs to the ``mosquitto`` user, and every folder above ``broker/``
must let that user through (checked before anything is written). Run through ``sudo``,
the bundles and the coordinator's credentials belong to the user who ran ``sudo``
(``SUDO_UID``), so they can be copied and used without root; the CA key stays root's.
Without root, everything belongs to the current user, and mosquitto, started by that
user, reads it as it is. Secrets are never readable by others.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from device.errors import ConfigError

Role = Literal["site", "broker", "admin"]  # owned by: the runner; root + group mosquitto; the sudo user
BROKER_USER = "mosquitto"


@dataclass(frozen=True)
class SiteLayout:
    """Paths inside a site folder ``root`` (absolute)."""

    root: Path

    @property
    def site_file(self) -> Path:
        return self.root / "site.toml"

    @property
    def ca_dir(self) -> Path:
        return self.root / "ca"

    @property
    def ca_cert(self) -> Path:
        return self.ca_dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.ca_dir / "ca.key"

    @property
    def broker_dir(self) -> Path:
        return self.root / "broker"

    @property
    def broker_conf(self) -> Path:
        return self.broker_dir / "mosquitto.conf"

    @property
    def passwords(self) -> Path:
        return self.broker_dir / "passwords"

    @property
    def coordinator_dir(self) -> Path:
        return self.root / "coordinator"

    @property
    def devices_dir(self) -> Path:
        return self.root / "devices"

    def bundle(self, device: str) -> Path:
        return self.devices_dir / device


# file names inside a credentials folder (a device bundle or the coordinator's)
CA_FILE, PASSWORD_FILE, DEVICE_TOML = "ca.crt", "password", "device.toml"
CERT_FILE, KEY_FILE = "client.crt", "client.key"


def toml_value(value: str | int | bool | list[str]) -> str:
    """A TOML value (JSON strings are TOML basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(value)


def toml_text(comment: list[str], values: dict[str, str | int | bool | list[str] | None]) -> str:
    lines = [f"# {line}" for line in comment]
    lines += [f"{key} = {toml_value(value)}" for key, value in values.items() if value is not None]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Owners:
    """Who owns the site's files; ``None`` fields mean the current user (not root)."""

    broker_gid: int | None = None
    broker_uid: int | None = None
    admin: tuple[int, int] | None = None

    @classmethod
    def here(cls) -> Owners:
        """For the current process: as root, the ``mosquitto`` user and group (and the
        ``sudo`` user for the bundles); otherwise the current user alone."""
        if os.geteuid() != 0:
            return cls()
        try:
            user = pwd.getpwnam(BROKER_USER)
            group = grp.getgrnam(BROKER_USER)
        except KeyError:
            raise ConfigError(
                "running as root, covey site init makes the broker's files readable by the mosquitto user, but "
                "this machine has none: install mosquitto first (apt-get install mosquitto), or run as a normal user"
            ) from None
        admin = None
        if os.environ.get("SUDO_UID", "").isdigit() and os.environ.get("SUDO_GID", "").isdigit():
            admin = (int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"]))
        return cls(group.gr_gid, user.pw_uid, admin)

    @property
    def as_root(self) -> bool:
        return self.broker_gid is not None

    def _chown(self, path: Path, role: Role) -> None:
        if not self.as_root:
            return
        if role == "broker":
            os.chown(path, 0, self.broker_gid)  # type: ignore[arg-type]
        elif role == "admin" and self.admin is not None:
            os.chown(path, *self.admin)
        else:
            os.chown(path, 0, 0)

    def write(self, path: Path, data: bytes | str, role: Role, *, secret: bool) -> None:
        """Write a new file with its mode and owner set before any byte is in it."""
        raw = data.encode() if isinstance(data, str) else data
        mode = (0o640 if role == "broker" and self.as_root else 0o600) if secret else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits away
            self._chown(path, role)
            os.write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)

    def mkdir(self, path: Path, role: Role, *, mode: int = 0o700) -> None:
        path.mkdir()
        if role == "broker" and self.as_root:
            mode = 0o750
        os.chmod(path, mode)
        self._chown(path, role)

    def data_dir(self, path: Path) -> None:
        """mosquitto's persistence folder: the ``mosquitto`` user writes it."""
        path.mkdir()
        os.chmod(path, 0o700)
        if self.as_root:
            os.chown(path, self.broker_uid, self.broker_gid)  # type: ignore[arg-type]

    def check_reachable(self, folder: Path) -> None:
        """As root: every existing folder from ``/`` down to ``folder`` lets the
        ``mosquitto`` user through, else mosquitto cannot open its files."""
        if not self.as_root:
            return
        for parent in reversed([folder, *folder.parents]):
            if not parent.exists():
                break
            st = parent.stat()
            if st.st_mode & stat.S_IXOTH:
                continue
            if st.st_gid == self.broker_gid and st.st_mode & stat.S_IXGRP:
                continue
            if st.st_uid == self.broker_uid and st.st_mode & stat.S_IXUSR:
                continue
            raise ConfigError(
                f"mosquitto runs as the user {BROKER_USER} and cannot enter {parent} (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); put the site where it can, e.g. /etc/mosquitto/covey"
            )
