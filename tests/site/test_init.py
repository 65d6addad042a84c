"""``covey site init`` and ``add-device``: what they write, who owns it, and every mistake.

The files are checked as mosquitto and the boards will use them: the broker
certificate's SANs, the password hashes against ``mosquitto_passwd``'s, the ACL and
config lines, each bundle's ``device.toml`` read by the device CLI. A mistake is one
line on stderr, exit status 2, and nothing written (the parent folder is unchanged,
an existing site untouched).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from server.site import load_site
from server.site.certs import subject_alt_names
from server.site.mosquitto import hash_password, verify_password
from tests.covey.test_cli_mistakes import assert_one_line_error, covey
from tests.site.conftest import init

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ownership by the mosquitto group)")


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` with a hash of its content and its mode."""
    out = {}
    for path in sorted(folder.rglob("*")):
        data = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(folder))] = f"{data} {stat.S_IMODE(path.stat().st_mode):o}"
    return out


def test_init_writes_a_site_the_broker_and_boards_can_use(site_parent: Path) -> None:
    # Execute
    site = init(site_parent / "site", "pi-kitchen", "pi-garage")

    # Assert: the broker certificate names every host and address
    layout = site.layout
    dns, ips = subject_alt_names((layout.broker_dir / "broker.crt").read_bytes())
    assert dns == ["localhost"] and ips == ["127.0.0.1"]
    # one password line per identity, each the hash of the password in its bundle
    lines = dict(line.split(":", 1) for line in layout.passwords.read_text().splitlines())
    assert sorted(lines) == ["coordinator", "pi-garage", "pi-kitchen"]
    for user in ("pi-kitchen", "pi-garage"):
        assert verify_password((layout.bundle(user) / "password").read_text().strip(), lines[user])
    assert verify_password((layout.coordinator_dir / "password").read_text().strip(), lines["coordinator"])
    # the ACL binds writes to the user name; the config names the files and the safety settings
    acl = (layout.broker_dir / "acl").read_text()
    # (exactly the four kinds of its own topics and its hand-offs, in the site's run only)
    for kind in ("register", "results", "frames", "status"):
        assert f"pattern write covey/siterun/from/%u/{kind}" in acl.splitlines()
    assert "pattern write covey/siterun/device/+/frames/from/%u" in acl.splitlines()
    assert "covey/+/" not in acl and "from/%u/#" not in acl
    assert "user pi-garage" in acl and "user coordinator\ntopic readwrite covey/#" in acl
    conf = layout.broker_conf.read_text()
    for line in (
        "allow_anonymous false",
        "use_username_as_clientid true",
        "persistence true",
        f"persistence_location {layout.broker_dir / 'data'}/",
        "max_inflight_messages 64",
        "max_queued_messages 10000",
        "max_packet_size 1048576",
        f"max_queued_bytes {256 * 2**20}",
        f"memory_limit {256 * 2**20}",
        f"listener {site.spec.port}",
        f"listener {site.spec.loopback_port} 127.0.0.1",
        f"keyfile {layout.broker_dir / 'broker.key'}",
    ):
        assert line in conf.splitlines(), line
    # a bundle per board, its config complete but for the data
    toml = (layout.bundle("pi-kitchen") / "device.toml").read_text()
    for line in (
        f'broker = "localhost:{site.spec.port}"',
        'run = "siterun"',
        'id = "pi-kitchen"',
        'username = "pi-kitchen"',
        'password_file = "password"',
        'ca_certs = "ca.crt"',
    ):
        assert line in toml.splitlines(), line
    assert "certfile" not in toml
    assert load_site(layout.root).spec.devices == ("pi-kitchen", "pi-garage")


def test_our_password_hash_is_mosquittos_own(site_parent: Path) -> None:
    # Prepare: mosquitto_passwd hashes a password; we hash the same with its salt
    file = site_parent / "pw"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(file), "alice", "s3cret"], check=True)
    theirs = file.read_text().strip().split(":", 1)[1]
    salt = __import__("base64").b64decode(theirs.split("$")[3])

    # Assert
    assert hash_password("s3cret", salt) == theirs
    assert verify_password("s3cret", theirs) and not verify_password("other", theirs)


def test_client_certs_are_issued_to_every_identity(site_parent: Path) -> None:
    site = init(site_parent / "site", "d1", extra=("--client-certs",))
    assert "require_certificate true" in site.layout.broker_conf.read_text()
    for folder in (site.layout.bundle("d1"), site.layout.coordinator_dir):
        assert (folder / "client.crt").exists() and (folder / "client.key").exists()
    toml = (site.layout.bundle("d1") / "device.toml").read_text()
    assert 'certfile = "client.crt"' in toml and 'keyfile = "client.key"' in toml


@ROOT_ONLY
def test_as_root_the_broker_files_are_readable_by_the_mosquitto_group_only(site_parent: Path) -> None:
    import grp
    import pwd

    # Execute
    site = init(site_parent / "site", "d1")

    # Assert: what mosquitto reads after dropping to its user; no secret readable by others
    layout = site.layout
    gid, uid = grp.getgrnam("mosquitto").gr_gid, pwd.getpwnam("mosquitto").pw_uid
    for name in ("broker.key", "passwords", "acl"):
        st = (layout.broker_dir / name).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o640), name
    st = layout.broker_dir.stat()
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (gid, 0o750)
    assert (layout.broker_dir / "data").stat().st_uid == uid
    for secret in (layout.ca_key, layout.bundle("d1") / "password", layout.coordinator_dir / "password"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret


@pytest.mark.slow
@ROOT_ONLY
def test_as_root_through_sudo_the_bundles_belong_to_the_sudo_user(site_parent: Path) -> None:
    # Execute: sudo sets SUDO_UID/SUDO_GID
    env = {**os.environ, "SUDO_UID": "65534", "SUDO_GID": "65534", "PYTHONPATH": str(Path.cwd())}
    argv = [sys.executable, "-m", "covey.cli", "site", "init", str(site_parent / "site"), "--ip", "10.0.0.1"]
    subprocess.run([*argv, "--devices", "d1"], check=True, env=env, capture_output=True)

    # Assert: the admin copies bundles and runs the coordinator without root; the CA key stays root's
    site = site_parent / "site"
    for path in (site / "devices" / "d1" / "password", site / "coordinator" / "password", site / "devices"):
        assert path.stat().st_uid == 65534, path
    assert (site / "ca" / "ca.key").stat().st_uid == 0


@ROOT_ONLY
def test_as_root_a_folder_mosquitto_cannot_enter_is_refused() -> None:
    private = Path(tempfile.mkdtemp(prefix="covey-private-"))  # 0700, root's
    try:
        proc = covey("site", "init", str(private / "site"), "--ip", "10.0.0.1", "--devices", "d1")
        assert_one_line_error(proc, "mosquitto", str(private), "0700", "/etc/mosquitto/covey")
        assert list(private.iterdir()) == []
    finally:
        private.rmdir()


@pytest.mark.slow
def test_add_device_adds_a_password_an_acl_entry_and_a_bundle(site_parent: Path) -> None:
    # Prepare
    site = init(site_parent / "site", "d1")

    # Execute
    proc = covey("site", "add-device", str(site.layout.root), "d2", "--client-cert")

    # Assert
    assert proc.returncode == 0, proc.stderr
    layout = site.layout
    lines = dict(line.split(":", 1) for line in layout.passwords.read_text().splitlines())
    assert sorted(lines) == ["coordinator", "d1", "d2"]
    assert verify_password((layout.bundle("d2") / "password").read_text().strip(), lines["d2"])
    assert "user d2" in (layout.broker_dir / "acl").read_text()
    assert (layout.bundle("d2") / "client.crt").exists()
    assert load_site(layout.root).spec.devices == ("d1", "d2")
    assert "reload" in proc.stdout


# -- mistakes: one line, exit status 2, nothing written --------------------------------------------
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--host", "broker.lan"], ["--devices", "at least one"]),
        (["--host", "broker.lan", "--devices"], ["--devices", "expected at least one argument"]),
        (["--host", "broker.lan", "--devices", "pi/1"], ["'pi/1'", "letters, digits"]),
        (["--host", "broker.lan", "--devices", ".."], ["'..'", "letters, digits"]),
        (["--host", "broker.lan", "--devices", "pi:1"], ["'pi:1'"]),
        (["--host", "broker.lan", "--devices", "coordinator"], ["'coordinator'", "reserved"]),
        (["--host", "broker.lan", "--devices", "a", "a"], ["'a'", "twice"]),
        (["--ip", "192.168.1.300", "--devices", "a"], ["--ip", "'192.168.1.300'", "IP address"]),
        (["--host", "192.168.1.10", "--devices", "a"], ["--host", "--ip"]),
        (["--host", "bad_host!", "--devices", "a"], ["--host", "'bad_host!'", "host name"]),
        (["--devices", "a"], ["--host", "--ip"]),
        (["--ip", "10.0.0.1", "--devices", "a", "--port", "70000"], ["--port", "70000"]),
        (["--ip", "10.0.0.1", "--devices", "a", "--port", "8883", "--loopback-port", "8883"], ["--loopback-port"]),
        (["--ip", "10.0.0.1", "--devices", "a", "--run", "a/b"], ["--run", "'a/b'"]),
    ],
)
@pytest.mark.slow
def test_init_mistakes(site_parent: Path, argv: list[str], needles: list[str]) -> None:
    proc = covey("site", "init", str(site_parent / "site"), *argv)
    assert_one_line_error(proc, *needles)
    assert list(site_parent.iterdir()) == []  # no site, no half-written folder beside it


@pytest.mark.slow
def test_an_existing_site_is_not_replaced_without_force(site_parent: Path) -> None:
    # Prepare
    site = init(site_parent / "site", "d1")
    before = snapshot(site.layout.root)

    # Execute
    proc = covey("site", "init", str(site.layout.root), "--ip", "10.0.0.1", "--devices", "d2")

    # Assert
    assert_one_line_error(proc, str(site.layout.root), "--force")
    assert snapshot(site.layout.root) == before
    assert sorted(p.name for p in site_parent.iterdir()) == ["site"]

    # and with --force it is replaced whole
    proc = covey("site", "init", str(site.layout.root), "--ip", "10.0.0.1", "--devices", "d2", "--force")
    assert proc.returncode == 0, proc.stderr
    assert load_site(site.layout.root).spec.devices == ("d2",)
    assert sorted(p.name for p in site_parent.iterdir()) == ["site"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["d1"], ["'d1'", "already"]),
        (["d/2"], ["ID", "'d/2'"]),
        (["server"], ["'server'", "reserved"]),
    ],
)
def test_add_device_mistakes(site_parent: Path, args: list[str], needles: list[str]) -> None:
    site = init(site_parent / "site", "d1")
    before = snapshot(site.layout.root)
    assert_one_line_error(covey("site", "add-device", str(site.layout.root), *args), *needles)
    assert snapshot(site.layout.root) == before


@pytest.mark.slow
def test_commands_on_a_folder_that_is_not_a_site(site_parent: Path) -> None:
    for argv in (["site", "add-device", str(site_parent), "d1"], ["broker", "run", "--site", str(site_parent)]):
        assert_one_line_error(covey(*argv), str(site_parent), "not a covey site", "covey site init")
    assert list(site_parent.iterdir()) == []
