"""``covey server run``'s connection settings: --site, credentials and TLS flags, --listen.

The settings are resolved and every file checked before a broker starts or a file is
written; a mistake is one line and exit status 2. A server that starts its own
mosquitto with ``--listen 0.0.0.0`` is reachable from the LAN and advertises the LAN
address, never 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from covey.cli import build_parser
from covey.server_commands import _connection
from device.mqtt import MqttLink
from server.broker import advertised_host, is_loopback
from tests.covey.test_cli_mistakes import REPO, _env, assert_one_line_error, covey
from tests.site.conftest import init

RUN_ARGS = ["server", "run", "--min-devices", "1", "--rounds", "1"]


def connection(*argv: str):  # type: ignore[no-untyped-def]
    return _connection(build_parser().parse_args([*RUN_ARGS, *argv]))


def test_site_gives_the_run_the_broker_and_the_coordinators_credentials(site_parent: Path) -> None:
    # Prepare
    site = init(site_parent / "site", "d1")
    folder = site.layout.coordinator_dir

    # Execute
    conn = connection("--site", str(site.layout.root))
    plain = connection("--site", str(site.layout.root), "--broker", f"127.0.0.1:{site.spec.loopback_port}")
    other = connection("--site", str(site.layout.root), "--run", "other", "--ca-certs", str(site.layout.ca_cert))

    # Assert
    assert (conn.host, conn.port, conn.run) == ("localhost", site.spec.port, "siterun")
    assert conn.username == "coordinator" and conn.password == (folder / "password").read_text().strip()
    assert conn.tls is not None and conn.tls.ca_certs == str(folder / "ca.crt")
    assert plain.tls is None and plain.password == conn.password  # the loopback listener is plain MQTT
    assert other.run == "other" and other.tls is not None and other.tls.ca_certs == str(site.layout.ca_cert)


def test_explicit_flags_give_the_same_settings(site_parent: Path) -> None:
    site = init(site_parent / "site", "d1")
    folder = site.layout.coordinator_dir
    conn = connection(
        "--broker",
        f"127.0.0.1:{site.spec.port}",
        "--username",
        "coordinator",
        "--password-file",
        str(folder / "password"),
        "--ca-certs",
        str(folder / "ca.crt"),
    )
    assert (conn.host, conn.port, conn.run, conn.username) == ("127.0.0.1", site.spec.port, "site", "coordinator")
    assert conn.password == (folder / "password").read_text().strip()
    assert conn.tls is not None and conn.tls.ca_certs == str(folder / "ca.crt")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--username", "coordinator"], ["--username", "--broker or --site"]),
        (["--ca-certs", "ca.crt"], ["--ca-certs", "--broker or --site"]),
        (["--broker", "127.0.0.1:1", "--listen", "0.0.0.0"], ["--listen", "already"]),
        (["--listen", "everywhere"], ["--listen", "'everywhere'", "0.0.0.0"]),
        (["--broker", "127.0.0.1:1", "--password-file", "pw"], ["--password-file", "--username"]),
        (["--broker", "127.0.0.1:1", "--username", "u", "--password-file", "/nonexistent/pw"], ["/nonexistent/pw"]),
        (["--broker", "127.0.0.1:1", "--ca-certs", "/nonexistent/ca.crt"], ["--ca-certs", "/nonexistent/ca.crt"]),
        (["--site", "/nonexistent/site"], ["/nonexistent/site", "not a covey site"]),
        (["--broker", "127.0.0.1:1", "--dashboard", "web"], ["--dashboard", "[HOST:]PORT"]),
        (["--broker", "127.0.0.1:1", "--dashboard-state", "/tmp"], ["--dashboard-state /tmp", "folder"]),
    ],
)
def test_connection_mistakes(tmp_path: Path, argv: list[str], needles: list[str]) -> None:
    state = tmp_path / "state"
    proc = covey(*RUN_ARGS, "--state-dir", str(state), *argv)
    assert_one_line_error(proc, *needles)
    assert not state.exists()


@pytest.mark.slow
def test_a_site_without_the_coordinators_password_is_named(site_parent: Path, tmp_path: Path) -> None:
    site = init(site_parent / "site", "d1")
    (site.layout.coordinator_dir / "password").unlink()
    proc = covey(*RUN_ARGS, "--site", str(site.layout.root), "--state-dir", str(tmp_path / "state"))
    assert_one_line_error(proc, "coordinator password", str(site.layout.coordinator_dir / "password"))
    assert not (tmp_path / "state").exists()


def test_the_advertised_host_is_never_loopback_for_a_broker_on_every_interface() -> None:
    assert advertised_host("0.0.0.0", lan_ip=lambda: "192.168.1.10") == "192.168.1.10"
    assert advertised_host("::", lan_ip=lambda: "192.168.1.10") == "192.168.1.10"
    assert advertised_host("192.168.1.20") == "192.168.1.20"
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("192.168.1.10")


def _has_lan_address() -> bool:
    from device.discovery import local_ip

    return not is_loopback(local_ip())


@pytest.mark.broker
@pytest.mark.skipif(not _has_lan_address(), reason="this machine has no LAN address to listen on")
def test_server_run_with_listen_is_reachable_at_the_lan_address_it_advertises(tmp_path: Path) -> None:
    from device.discovery import discover, local_ip

    # Prepare
    argv = [*RUN_ARGS, "--run", "listen-test", "--listen", "0.0.0.0", "--advertise", "--register-timeout", "120"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "covey.cli", *argv, "--state-dir", str(tmp_path / "state")],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Execute: what a board does without --broker
        host, port, run = discover("listen-test", timeout=60)
        link = MqttLink("board-elsewhere", host, port, clean_session=True)
        link.connect(10)
        link.close()
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the server stops the mosquitto it started
        out, err = proc.communicate(timeout=30)

    # Assert
    assert (host, run) == (local_ip(), "listen-test")
    assert f"started mosquitto on 0.0.0.0:{port}" in out
    assert proc.returncode == 130, err
    deadline = time.monotonic() + 10
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listening(port)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="as root every file is readable")
def test_unreadable_password_file(tmp_path: Path) -> None:  # pragma: no cover - CI here is root
    pw = tmp_path / "pw"
    pw.write_text("x")
    pw.chmod(0)
    proc = covey(*RUN_ARGS, "--broker", "127.0.0.1:1", "--username", "u", "--password-file", str(pw))
    assert_one_line_error(proc, str(pw), "cannot be read")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "list_text", "needles"),
    [
        (["--allow-devices", "{list}"], "dev000\nbad/id\n", ["--allow-devices", "line 2", "bad/id"]),
        (["--allow-devices", "{list}"], "# nobody\n\n", ["--allow-devices", "names no device"]),
        (["--allow-devices", "/nonexistent/devices.txt"], None, ["--allow-devices", "/nonexistent/devices.txt"]),
        (["--allow-devices", "{list}"], "dev000\n\udcff\n", ["--allow-devices", "not UTF-8"]),
        (["--allow-devices", "{list}", "--min-devices", "3"], "dev000\ndev001\n", ["only 2 devices", "--min-devices"]),
        (["--max-devices", "0"], None, ["--max-devices", "at least 1"]),
        (["--round-attempts", "0"], None, ["--round-attempts", "at least 1"]),
        (["--norm-factor", "0.5"], None, ["norm factor", "above 1"]),
        (["--trim", "0.7"], None, ["trim", "[0, 0.5)"]),
    ],
)
def test_admission_and_screening_mistakes(
    tmp_path: Path, argv: list[str], list_text: str | None, needles: list[str]
) -> None:
    listing = tmp_path / "devices.txt"
    if list_text is not None:
        listing.write_bytes(list_text.encode("utf-8", "surrogateescape"))
    state = tmp_path / "state"
    proc = covey(*RUN_ARGS, "--state-dir", str(state), *[a.replace("{list}", str(listing)) for a in argv])
    assert_one_line_error(proc, *needles)
    assert not state.exists()


def test_a_site_admits_its_provisioned_devices_unless_a_list_is_given(site_parent: Path, tmp_path: Path) -> None:
    site = init(site_parent / "site", "d1")
    listing = tmp_path / "devices.txt"
    listing.write_text("d1\nspare\n")
    assert connection("--site", str(site.layout.root)).allowed_devices == frozenset(site.spec.devices)
    assert connection("--site", str(site.layout.root), "--allow-devices", str(listing)).allowed_devices == {
        "d1",
        "spare",
    }
    assert connection().allowed_devices is None  # an open run on a broker this command starts


@pytest.mark.slow
def test_covey_links_prints_a_runs_matrices_and_says_what_is_wrong_otherwise(tmp_path: Path) -> None:
    import json

    from device.protocol import LinkReport, PathReport
    from server.links import build_link_matrices

    # Prepare
    reports = {"a": LinkReport("t", (PathReport("server", 3, 3, 2.0, 0.1, 4e7), PathReport("b", 3, 3, 3.5, 0.2, 2e7)))}
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"links": build_link_matrices(["a", "b"], reports, {}).to_dict()}))
    (tmp_path / "bare.json").write_text(json.dumps({"rounds": []}))

    # Execute
    shown = covey("links", str(run))
    no_links = covey("links", str(tmp_path / "bare.json"))

    # Assert
    assert shown.returncode == 0 and "3.5*" in shown.stdout and "RTT" in shown.stdout, shown.stderr
    assert_one_line_error(no_links, "holds no link measurements")
    (tmp_path / "bent.json").write_text(
        json.dumps({"links": {**json.loads((run / "results.json").read_text())["links"], "snr_source": [["measured"]]}})
    )
    assert_one_line_error(covey("links", str(tmp_path / "bent.json")), "links are malformed")
    assert_one_line_error(covey("links", str(tmp_path / "nothing")), "cannot read it")


def test_docs_running_md_names_every_flag_of_covey_server_run() -> None:
    # docs/running.md says its table holds every flag; a flag added without a row fails here
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    server = next(a for a in sub.choices["server"]._actions if isinstance(a, argparse._SubParsersAction))
    flags = {o for a in server.choices["run"]._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    doc = (REPO / "docs" / "running.md").read_text()
    assert sorted(f for f in flags if f"`{f}" not in doc) == []
