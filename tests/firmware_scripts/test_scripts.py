"""firmware_scripts/broker-setup.sh and provision-device.sh, with and without systemd.

The systemd path runs against a ``systemctl`` stand-in on PATH that records its
arguments (a test must not restart this machine's services), with the unit and
conf.d folders redirected by the scripts' environment variables; every other part
is real: ``covey site init``, the copied files and their modes. The path without
systemd is replayed in full by tests/site/test_site_run.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "firmware_scripts"
BIN = Path(sys.executable).parent


@pytest.fixture
def systemctl(tmp_path: Path) -> Path:
    """A stand-in ``systemctl`` that logs its arguments; returns the log."""
    folder = tmp_path / "bin"
    folder.mkdir()
    log = tmp_path / "systemctl.log"
    fake = folder / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n')
    fake.chmod(0o755)
    return log


def run(script: str, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), "COVEY": str(BIN / "covey"), **env}
    return subprocess.run([str(SCRIPTS / script), *argv], env=full, capture_output=True, text=True, timeout=120)


def one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def site(folder: Path) -> Path:
    argv = [str(BIN / "covey"), "site", "init", str(folder), "--ip", "10.0.0.1", "--devices", "pi-1"]
    subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True)
    return folder


@pytest.mark.slow
def test_provision_with_systemd_installs_the_bundle_and_the_unit(
    site_parent: Path, tmp_path: Path, systemctl: Path
) -> None:
    # Prepare
    bundle = site(site_parent / "site") / "devices" / "pi-1"
    data, test = tmp_path / "train.npz", tmp_path / "test.npz"
    data.write_bytes(b"x")
    test.write_bytes(b"x")
    prefix, units = tmp_path / "root", tmp_path / "units"
    units.mkdir()

    # Execute
    proc = run(
        "provision-device.sh",
        str(bundle),
        str(data),
        str(test),
        COVEY_PREFIX=str(prefix),
        COVEY_SYSTEMD="yes",
        SYSTEMD_UNIT_DIR=str(units),
        COVEY_DEVICE="/opt/covey/venv/bin/covey-device",
        PATH=f"{systemctl.parent / 'bin'}:{os.environ['PATH']}",
    )

    # Assert: the bundle with its secrets private, the data paths added, the unit enabled and (re)started
    assert proc.returncode == 0, proc.stderr
    etc = prefix / "etc" / "covey"
    assert stat.S_IMODE((etc / "password").stat().st_mode) == 0o600
    assert stat.S_IMODE(etc.stat().st_mode) == 0o700
    assert (etc / "password").read_text() == (bundle / "password").read_text()
    toml = (etc / "device.toml").read_text()
    for line in (f'data = "{data}"', f'test = "{test}"', f'state_dir = "{prefix}/var/lib/covey/pi-1"', 'id = "pi-1"'):
        assert line in toml.splitlines(), line
    unit = (units / "covey-device.service").read_text()
    assert f"ExecStart=/opt/covey/venv/bin/covey-device --config {etc}/device.toml -v" in unit
    assert systemctl.read_text().splitlines() == ["daemon-reload", "enable covey-device", "restart covey-device"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        ([], ["bundle folder", "usage"]),
        (["{site}"], ["bundle folder", "usage"]),
        (["{site}", "{data}"], ["no device.toml", "DIR/devices/ID"]),
        (["{bundle}", "/nonexistent/train.npz"], ["/nonexistent/train.npz", "does not exist"]),
        (["{bundle}", "{data}", "/nonexistent/test.npz"], ["/nonexistent/test.npz", "does not exist"]),
    ],
)
def test_provision_mistakes_are_one_line_and_install_nothing(
    site_parent: Path, tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    folder = site(site_parent / "site")
    data = tmp_path / "train.npz"
    data.write_bytes(b"x")
    values = {"site": str(folder), "bundle": str(folder / "devices" / "pi-1"), "data": str(data)}
    prefix = tmp_path / "root"
    proc = run("provision-device.sh", *(a.format(**values) for a in args), COVEY_PREFIX=str(prefix), COVEY_SYSTEMD="no")
    one_line(proc, *needles)
    assert not prefix.exists()


@pytest.mark.slow
def test_broker_setup_without_systemd_makes_the_site_and_says_how_to_run_it(site_parent: Path) -> None:
    proc = run(
        "broker-setup.sh", str(site_parent / "site"), "--ip", "10.0.0.1", "--devices", "pi-1", COVEY_SYSTEMD="no"
    )
    assert proc.returncode == 0, proc.stderr
    assert (site_parent / "site" / "devices" / "pi-1" / "device.toml").exists()
    assert f"broker run --site {site_parent / 'site'}" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the systemd path runs covey site init as root; sudo would ask")
def test_broker_setup_with_systemd_installs_the_config_for_the_service(
    site_parent: Path, tmp_path: Path, systemctl: Path
) -> None:
    # Execute
    conf_d = tmp_path / "conf.d"
    proc = run(
        "broker-setup.sh",
        str(site_parent / "site"),
        "--host",
        "broker.lan",
        "--ip",
        "192.168.1.10",
        "--devices",
        "pi-1",
        COVEY_SYSTEMD="yes",
        MOSQUITTO_CONF_D=str(conf_d),
        PATH=f"{systemctl.parent / 'bin'}:{os.environ['PATH']}",
    )

    # Assert: the site's config, for the system service (sessions in /var/lib/mosquitto), installed and restarted
    assert proc.returncode == 0, proc.stderr
    conf = (conf_d / "covey.conf").read_text()
    assert conf == (site_parent / "site" / "broker" / "mosquitto.conf").read_text()
    assert "persistence_location /var/lib/mosquitto/" in conf
    assert not (site_parent / "site" / "broker" / "data").exists()
    assert systemctl.read_text().splitlines() == ["restart mosquitto", "is-active --quiet mosquitto"]


def test_broker_setup_without_a_folder_is_one_line() -> None:
    one_line(run("broker-setup.sh", "--host", "broker.lan", COVEY_SYSTEMD="no"), "site folder", "usage")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--backend", "onnx", "{prefix}"], ["unknown backend 'onnx'", "litert or tflite-runtime"]),
        (["--backend"], ["--backend needs litert or tflite-runtime", "usage"]),
        (["--fast", "{prefix}"], ["unknown option --fast", "usage"]),
        (["{prefix}", "{prefix}2"], ["one PREFIX only", "usage"]),
    ],
)
def test_install_mistakes_are_one_line_and_install_nothing(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    prefix = tmp_path / "covey"
    proc = run("install-device.sh", *(a.format(prefix=prefix) for a in args))
    one_line(proc, *needles)
    assert not prefix.exists() and not (tmp_path / "covey2").exists()


@pytest.mark.parametrize(
    ("machine", "words"),
    [
        ("armv6l", "no TFLite interpreter has wheels for armv6l (Pi 1, Pi Zero)"),
        ("i686", "no TFLite interpreter has wheels for i686"),
    ],
)
def test_install_refuses_machines_without_interpreter_wheels(tmp_path: Path, machine: str, words: str) -> None:
    # Prepare: `uname -m` answering as that machine (an ARMv6 Pi cannot be emulated with
    # Debian's armhf, which needs ARMv7 instructions)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text(f'#!/bin/sh\n[ "$1" = -m ] && echo {machine} || exec /bin/uname "$@"\n')
    (bin_dir / "uname").chmod(0o755)

    # Execute
    proc = run("install-device.sh", str(tmp_path / "covey"), PATH=f"{bin_dir}:{os.environ['PATH']}")

    # Assert
    one_line(proc, words)
    assert not (tmp_path / "covey").exists()


def test_install_help_says_what_each_board_gets() -> None:
    proc = run("install-device.sh", "--help")
    assert proc.returncode == 0
    for words in ("64-bit (aarch64, x86_64)", "32-bit (armv7l)", "armv6l", "--backend litert|tflite-runtime"):
        assert words in proc.stdout, proc.stdout


@pytest.mark.slow
def test_provision_with_a_prefix_and_a_writer_of_a_leaf_file(site_parent: Path, tmp_path: Path) -> None:
    # Prepare: the shared FEMNIST sample's first file (5 writers), a relative prefix
    from covey.paths import femnist_dir

    bundle = site(site_parent / "site") / "devices" / "pi-1"
    leaf = sorted((femnist_dir() / "train").glob("*.json"))[0]
    writers = json.loads(leaf.read_text())["users"]

    # Execute: without a writer, with one not in the file, then with one
    none = run("provision-device.sh", "--prefix", str(tmp_path / "a"), str(bundle), str(leaf), COVEY_SYSTEMD="no")
    wrong = run("provision-device.sh", "--prefix", str(tmp_path / "b"), "--user", "f0_0", str(bundle), str(leaf))
    done = subprocess.run(
        [str(SCRIPTS / "provision-device.sh"), "--prefix", "boards/pi-1", "--user", writers[2], str(bundle), str(leaf)],
        env={**os.environ, "COVEY_SYSTEMD": "no"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )

    # Assert: mistakes list the writers and install nothing; the writer lands in device.toml
    one_line(none, "holds 5 writers", "--user WRITER", *writers)
    one_line(wrong, "'f0_0' is not in", *writers)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert done.returncode == 0, done.stderr
    etc = tmp_path / "boards" / "pi-1" / "etc" / "covey"
    assert f'user = "{writers[2]}"' in (etc / "device.toml").read_text().splitlines()
    assert done.stdout.strip().endswith(f"--config {etc}/device.toml -v")
