"""``covey site init`` and ``covey site add-device``: make a site folder, add a board to it.

Everything is checked and every key and certificate made before the first byte is
written. ``init`` writes the whole site into a hidden folder beside ``DIR`` and
renames it into place, so an interrupted run leaves no half-made site, and an existing
``DIR`` is replaced (``--force``) only once its successor is complete. ``add-device``
writes the new bundle, then replaces the password file, the ACL and ``site.toml``
(each written beside the old one and renamed over it).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from device.errors import ConfigError
from server.site.certs import Issued, issue_client, issue_server, make_ca
from server.site.edge import central_acl
from server.site.layout import (
    CA_FILE,
    CERT_FILE,
    DEVICE_TOML,
    KEY_FILE,
    PASSWORD_FILE,
    Owners,
    Role,
    SiteLayout,
    toml_text,
)
from server.site.mosquitto import (
    COORDINATOR,
    DEFAULT_MEMORY_MB,
    BrokerFiles,
    acl_text,
    config_text,
    new_password,
    password_line,
)
from server.site.spec import SiteSpec, check_device_id, check_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SYSTEM_PERSISTENCE = Path("/var/lib/mosquitto")
T = TypeVar("T")
AGAIN = "make the site again with `covey site init`"


@dataclass(frozen=True)
class Credentials:
    """A user's broker credentials as files: what ``--site`` and a bundle hold."""

    username: str
    password_file: Path
    ca_certs: Path
    certfile: Path | None
    keyfile: Path | None


@dataclass(frozen=True)
class Site:
    spec: SiteSpec
    layout: SiteLayout

    def coordinator(self) -> Credentials:
        folder = self.layout.coordinator_dir
        cert = folder / CERT_FILE
        has_cert = cert.exists()
        return Credentials(
            COORDINATOR,
            folder / PASSWORD_FILE,
            folder / CA_FILE,
            cert if has_cert else None,
            folder / KEY_FILE if has_cert else None,
        )


def _site_toml(spec: SiteSpec) -> str:
    return toml_text(
        [
            "A covey site, written by `covey site init`; `covey site add-device`, `covey server run --site`",
            "and `covey broker run --site` read it. Change a site by making it again, not by editing this.",
        ],
        {
            "run": spec.run,
            "hosts": list(spec.hosts),
            "ips": list(spec.ips),
            "port": spec.port,
            "loopback_port": spec.loopback_port,
            "client_certs": spec.client_certs,
            "system": spec.system,
            "broker_memory_mb": spec.broker_memory_mb,
            "devices": list(spec.devices),
        },
    )


def load_site(root: Path) -> Site:
    """The site in ``root``, or ConfigError saying how to make one."""
    layout = SiteLayout(Path(os.path.abspath(root)))
    try:
        raw = tomllib.loads(layout.site_file.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{root} is not a covey site (no site.toml in it); make one with `covey site init {root} --host NAME "
            "--devices ID...`"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {layout.site_file} ({exc}); {AGAIN}") from None
    try:
        spec = SiteSpec(
            run=_typed(raw, "run", str),
            hosts=tuple(_typed(raw, "hosts", list)),
            ips=tuple(_typed(raw, "ips", list)),
            devices=tuple(_typed(raw, "devices", list)),
            port=_typed(raw, "port", int),
            loopback_port=raw.get("loopback_port"),
            client_certs=_typed(raw, "client_certs", bool),
            system=_typed(raw, "system", bool),
            broker_memory_mb=raw.get("broker_memory_mb", DEFAULT_MEMORY_MB),  # sites made before it had none
        )
    except KeyError as exc:
        raise ConfigError(f"{layout.site_file} lacks {exc.args[0]!r}; {AGAIN}") from None
    return Site(spec, layout)


def _typed(raw: dict[str, object], key: str, kind: type[T]) -> T:
    value = raw[key]
    if not isinstance(value, kind) or (isinstance(value, list) and not all(isinstance(v, str) for v in value)):
        raise ConfigError(f"{key} in site.toml must be a {kind.__name__}, got {value!r}; was it edited?")
    return value


def _device_toml(spec: SiteSpec, device: str, has_cert: bool) -> str:
    return toml_text(
        [
            f"covey-device settings of {device!r} at the covey site {spec.run!r}, written by `covey site init`.",
            "Relative paths are relative to this file's folder. Give the data with --data (and --test),",
            "or let firmware_scripts/provision-device.sh add them.",
        ],
        {
            "broker": spec.broker,
            "run": spec.run,
            "id": device,
            "username": device,
            "password_file": PASSWORD_FILE,
            "ca_certs": CA_FILE,
            "certfile": CERT_FILE if has_cert else None,
            "keyfile": KEY_FILE if has_cert else None,
        },
    )


def _write_credentials(
    owners: Owners, folder: Path, ca: Issued, password: str, cert: Issued | None, extra: dict[str, str]
) -> None:
    """A folder of credentials (a bundle or the coordinator's), owned by the admin."""
    owners.mkdir(folder, "admin")
    owners.write(folder / CA_FILE, ca.cert_pem, "admin", secret=False)
    owners.write(folder / PASSWORD_FILE, password + "\n", "admin", secret=True)
    if cert is not None:
        owners.write(folder / CERT_FILE, cert.cert_pem, "admin", secret=False)
        owners.write(folder / KEY_FILE, cert.key_pem, "admin", secret=True)
    for name, text in extra.items():
        owners.write(folder / name, text, "admin", secret=False)


@contextmanager
def _writing(where: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or exc
        raise ConfigError(f"cannot write the site in {where} ({reason}); check the folder's permissions") from None


def init_site(root: Path, spec: SiteSpec, *, force: bool = False) -> Site:
    """Make the site folder ``root`` (see :mod:`server.site.layout`)."""
    spec = check_spec(spec)
    root = Path(os.path.abspath(root))
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} is a file; give a folder for the site")
    with _writing(root):
        occupied = root.is_dir() and any(root.iterdir())
    if occupied and not force:
        raise ConfigError(
            f"{root} already exists and is not empty; give a new folder, or --force to replace it "
            "(every board then needs its new bundle)"
        )
    owners = Owners.here()
    owners.check_reachable(root.parent)
    final = SiteLayout(root)
    ca = make_ca(spec.run)
    server = issue_server(ca, list(spec.hosts), list(spec.ips))
    users = {COORDINATOR: new_password(), **{d: new_password() for d in spec.devices}}
    certs = {u: issue_client(ca, u) for u in users} if spec.client_certs else {}
    files = BrokerFiles(
        final.broker_dir / "ca.crt",
        final.broker_dir / "broker.crt",
        final.broker_dir / "broker.key",
        final.passwords,
        final.broker_dir / "acl",
        SYSTEM_PERSISTENCE if spec.system else final.broker_dir / "data",
    )
    conf = config_text(
        spec.run,
        files,
        port=spec.port,
        loopback_port=spec.loopback_port,
        client_certs=spec.client_certs,
        memory_mb=spec.broker_memory_mb,
    )
    with _writing(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
        try:
            os.rmdir(staging)
            owners.mkdir(staging, "site", mode=0o755 if owners.as_root else 0o700)
            s = SiteLayout(staging)
            owners.mkdir(s.ca_dir, "site")
            owners.write(s.ca_cert, ca.cert_pem, "site", secret=False)
            owners.write(s.ca_key, ca.key_pem, "site", secret=True)
            owners.mkdir(s.broker_dir, "broker")
            owners.write(s.broker_dir / "ca.crt", ca.cert_pem, "broker", secret=False)
            owners.write(s.broker_dir / "broker.crt", server.cert_pem, "broker", secret=False)
            owners.write(s.broker_dir / "broker.key", server.key_pem, "broker", secret=True)
            owners.write(s.passwords, "".join(password_line(u, p) for u, p in users.items()), "broker", secret=True)
            owners.write(s.broker_dir / "acl", acl_text(spec.run, spec.devices), "broker", secret=True)
            owners.write(s.broker_conf, conf, "broker", secret=False)
            if not spec.system:
                owners.data_dir(s.broker_dir / "data")
            _write_credentials(owners, s.coordinator_dir, ca, users[COORDINATOR], certs.get(COORDINATOR), {})
            owners.mkdir(s.devices_dir, "admin")
            for device in spec.devices:
                toml = {DEVICE_TOML: _device_toml(spec, device, device in certs)}
                _write_credentials(owners, s.bundle(device), ca, users[device], certs.get(device), toml)
            owners.write(s.site_file, _site_toml(spec), "site", secret=False)
            _swap_into_place(staging, root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return Site(spec, final)


def _swap_into_place(staging: Path, root: Path) -> None:
    """Rename the finished site onto ``root``; an old one goes only once the new is there."""
    old = None
    if root.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old.", dir=root.parent))
        os.rmdir(old)
        os.rename(root, old)
    try:
        os.rename(staging, root)
    except OSError:
        if old is not None:
            os.rename(old, root)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def add_device(root: Path, device: str, *, client_cert: bool = False) -> Path:
    """Add ``device`` to the site in ``root``: its bundle, its password (and certificate).
    Returns the bundle folder. A running broker picks the new password up on SIGHUP."""
    site = load_site(root)
    spec, layout = site.spec, site.layout
    check_device_id(device, "ID")
    if device in spec.devices or layout.bundle(device).exists():
        raise ConfigError(f"{device!r} is already a device of the site in {root}; give a new id")
    owners = Owners.here()
    ca, old_passwords = read_secrets(site)
    password = new_password()
    with_cert = client_cert or spec.client_certs
    cert = issue_client(ca, device) if with_cert else None
    new = dataclasses.replace(spec, devices=(*spec.devices, device))
    with _writing(root):
        staging = Path(tempfile.mkdtemp(prefix=f".{device}.", dir=layout.devices_dir))
        try:
            os.rmdir(staging)
            toml = {DEVICE_TOML: _device_toml(spec, device, with_cert)}
            _write_credentials(owners, staging, ca, password, cert, toml)
            os.rename(staging, layout.bundle(device))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _replace(owners, layout.passwords, old_passwords + password_line(device, password), "broker", secret=True)
        _replace(owners, layout.broker_dir / "acl", central_acl(layout, spec.run, new.devices), "broker", secret=True)
        _replace(owners, layout.site_file, _site_toml(new), "site", secret=False)
    return layout.bundle(device)


def read_secrets(site: Site) -> tuple[Issued, str]:
    """The site's CA (certificate and key) and its broker password file."""
    layout = site.layout
    try:
        return Issued(layout.ca_cert.read_bytes(), layout.ca_key.read_bytes()), layout.passwords.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the site's CA or password file in {layout.root} ({exc.strerror or exc}); run as the user "
            "who made the site (with sudo if it was made as root)"
        ) from None


def _replace(owners: Owners, path: Path, text: str, role: Role, *, secret: bool) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    owners.write(tmp, text, role, secret=secret)
    os.replace(tmp, path)
