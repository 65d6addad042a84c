"""A new user's mistakes with ``covey-device`` end in one line on stderr and exit status 2.

Each test gives the agent a bad setting, on the command line or in its TOML file,
and checks: exit status 2, exactly one line on stderr naming the bad value (and the
file and key it came from) and what to do, no traceback, and no state folder
written. Stopping an agent (SIGTERM, Ctrl-C) whose broker went away is not a
mistake: it ends cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from device.cli import main
from device.errors import ConfigError, DataError, TransportError
from device.mqtt import MqttLink, TlsFiles

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.npz"
    np.savez(path, x=np.zeros((4, 60), np.float32), y=np.array([0, 1, 2, 3]))
    return path


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> str:
    assert "Traceback" not in out + err, err
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("covey-device: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def agent_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "device.cli", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=timeout,
    )


def _config(tmp_path: Path, data: Path, extra: str) -> Path:
    """A config that would reach a (closed) broker, with ``extra`` replacing or adding a line."""
    lines = {"data": f'"{data}"', "broker": '"127.0.0.1:1"', "run": '"r"', "state_dir": f'"{tmp_path / "state"}"'}
    key, _, value = extra.partition(" = ")
    lines[key] = value
    config = tmp_path / "agent.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in lines.items()))
    return config


# -- 8. data: mismatched x and y, unknown formats --------------------------------------------------
def test_unknown_data_extension(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "train.parquet"
    odd.write_bytes(b"PAR1")
    argv = ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(odd), "--state-dir", str(tmp_path / "state")]
    assert_one_line_error(*run_main(capsys, *argv), str(odd), "'.parquet'", ".json", ".npz", ".csv")
    assert not (tmp_path / "state").exists()


def _leaf(path: Path, users: dict[str, dict[str, list]]) -> Path:  # type: ignore[type-arg]
    path.write_text(json.dumps({"users": list(users), "num_samples": [1] * len(users), "user_data": users}))
    return path


def test_leaf_x_and_y_lengths_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from device.data import read_leaf

    # 3 samples of 4 features but 2 labels: 12 values would reshape to 2 x 6 without a check
    users = {"ok": {"x": [[0.0] * 4], "y": [1]}, "w7": {"x": [[0.0] * 4] * 3, "y": [1, 2]}}
    file = _leaf(tmp_path / "train.json", users)
    with pytest.raises(DataError) as info:
        read_leaf(file)
    message = str(info.value)
    for needle in (str(file), "'w7'", "3", "2", "'x'", "'y'"):
        assert needle in message, (needle, message)
    argv = ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(file), "--user", "w7"]
    assert_one_line_error(*run_main(capsys, *argv, "--state-dir", str(tmp_path / "state")), str(file), "'w7'")
    assert not (tmp_path / "state").exists()


def test_npz_x_and_y_lengths_differ(tmp_path: Path) -> None:
    from device.data import read_dataset

    path = tmp_path / "train.npz"
    np.savez(path, x=np.zeros((5, 4), np.float32), y=np.array([0, 1]))
    with pytest.raises(DataError, match=r"train\.npz.*5 samples.*2 labels"):
        read_dataset(path)


# -- 7. stopping when the broker is gone -----------------------------------------------------------
@pytest.fixture
def mosquitto():  # type: ignore[no-untyped-def]
    from server.broker import start_mosquitto

    with start_mosquitto() as handle:
        yield handle


@pytest.mark.broker
def test_link_close_is_safe_in_every_state(mosquitto) -> None:  # type: ignore[no-untyped-def]
    never = MqttLink("never-connected", "127.0.0.1", 1)
    never.close()
    never.close()

    link = MqttLink("closes-after-broker", mosquitto.host, mosquitto.port)
    link.connect(10)
    link.publish("covey/t/x", b"1", wait=5)
    mosquitto.stop()  # the broker goes away before close
    deadline = time.monotonic() + 10
    while link.connected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not link.connected
    with pytest.raises(TransportError, match="not connected"):
        link.publish("covey/t/x", b"offline", retain=True, wait=2.0)
    link.close()
    link.close()  # already closed
    link.publish("covey/t/x", b"after close")  # queued, never raises


def _agent_until_online(mosquitto, tmp_path: Path, data: Path) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    from device.protocol import Topics

    watcher = MqttLink("watcher", mosquitto.host, mosquitto.port, clean_session=True)
    watcher.connect(10)
    watcher.subscribe(Topics("r").status("d1"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "device.cli", "--broker", mosquitto.address, "--run", "r", "--id", "d1",
         "--data", str(data), "--state-dir", str(tmp_path / "state"), "--threads", "1"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            item = watcher.receive(0.5)
            if item is not None and item.payload == b"online":
                return proc
            assert proc.poll() is None, proc.communicate()
        raise AssertionError("the agent did not come online")
    finally:
        watcher.close()


@pytest.mark.broker
@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_stopping_the_agent_after_the_broker_went_away(
    mosquitto, tmp_path: Path, data: Path, sig: int, expected: int
) -> None:  # type: ignore[no-untyped-def]
    proc = _agent_until_online(mosquitto, tmp_path, data)
    lines: list[str] = []
    noticed = threading.Event()

    def read_stderr() -> None:  # until the agent exits; flags the line saying it reconnects
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "lost the broker" in line:
                noticed.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        mosquitto.stop()
        assert noticed.wait(30), "".join(lines)  # the agent noticed and is reconnecting
        proc.send_signal(sig)
        proc.wait(30)
        reader.join(10)
        assert proc.stdout is not None
        out, err = proc.stdout.read(), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out + err, err
    assert "RuntimeError" not in err
    assert proc.returncode == expected, err


# -- 5. every setting's type and range, naming the flag or the file and key ------------------------
@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ('threads = "four"', ["threads", '"four"', "integer >= 1"]),
        ("threads = 0", ["threads", "0", "integer >= 1"]),
        ("threads = 2.5", ["threads", "2.5", "integer >= 1"]),
        ("threads = true", ["threads", "true", "integer >= 1"]),
        ('idle_timeout = "soon"', ["idle_timeout", '"soon"', "number of seconds > 0"]),
        ("idle_timeout = 0", ["idle_timeout", "number of seconds > 0"]),
        ("idle_timeout = -5.0", ["idle_timeout", "-5.0", "number of seconds > 0"]),
        ('train_priority = "realtime"', ["train_priority", '"realtime"', "idle", "normal"]),
        ("max_chunk = 100", ["max_chunk", "100", "integer >= 65536"]),
        ('max_chunk = "1MB"', ["max_chunk", '"1MB"', "integer >= 65536"]),
        ("train_priority = 1", ["train_priority", "idle", "normal"]),
        ("run = 5", ["run", "5", "string"]),
        ('id = ""', ["id", "non-empty string"]),
        ('id = "a/b"', ["id", '"a/b"', "printable"]),
        ("username = 7", ["username", "string"]),
        ('ca_certs = ["a.crt"]', ["ca_certs", "string"]),
    ],
)
def test_config_values_are_checked(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], line: str, needles: list[str]
) -> None:
    config = _config(tmp_path, data, line)
    line_out = assert_one_line_error(*run_main(capsys, "--config", str(config)), *needles)
    assert str(config) in line_out
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("broker", "needles"),
    [('"localhost"', ['"localhost"', "HOST:PORT"]), ("1883", ["1883", "HOST:PORT"]), ('"h:70000"', ["HOST:PORT"])],
)
def test_config_broker_is_checked(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], broker: str, needles: list[str]
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'data = "{data}"\nbroker = {broker}\nrun = "r"\nstate_dir = "{tmp_path / "state"}"\n')
    line = assert_one_line_error(*run_main(capsys, "--config", str(config)), "broker", *needles)
    assert str(config) in line
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_the_config_file_names_itself_in_a_subprocess(tmp_path: Path, data: Path) -> None:
    config = _config(tmp_path, data, 'threads = "four"')
    proc = agent_cli("--config", str(config))
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, str(config), "threads", '"four"')
    config = _config(tmp_path, data, 'idle_timeout = "soon"')
    proc = agent_cli("--config", str(config))
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, str(config), "idle_timeout", '"soon"')
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--threads", "0"], ["--threads", "0", "integer >= 1"]),
        (["--threads", "four"], ["--threads", "'four'", "covey-device --help"]),
        (["--idle-timeout", "0"], ["--idle-timeout", "number of seconds > 0"]),
        (["--idle-timeout", "-1"], ["--idle-timeout", "-1", "number of seconds > 0"]),
        (["--idle-timeout", "nan"], ["--idle-timeout", "nan", "number of seconds > 0"]),
        (["--idle-timeout", "soon"], ["--idle-timeout", "'soon'"]),
        (["--train-priority", "realtime"], ["--train-priority", "'realtime'"]),
        (["--max-chunk", "0"], ["--max-chunk", "0", "integer >= 65536"]),
        (["--max-chunk", "1MB"], ["--max-chunk", "'1MB'"]),
        (["--broker", "localhost:0"], ["--broker", "HOST:PORT", "'localhost:0'"]),
        (["--broker", "localhost:http"], ["--broker", "HOST:PORT"]),
        (["--id", "a b"], ["'a b'", "printable"]),
    ],
)
def test_flags_follow_the_same_rules(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    base = ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(data), "--state-dir", str(tmp_path / "state")]
    assert_one_line_error(*run_main(capsys, *base, *argv), *needles)
    assert not (tmp_path / "state").exists()


def test_a_flag_overrides_a_bad_config_value(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, data, "threads = 0")
    # the flag wins, so the file's bad value is not used; the agent gets as far as the (absent) broker
    code, out, err = run_main(capsys, "--config", str(config), "--threads", "2")
    assert_one_line_error(code, out, err, "cannot reach the broker at 127.0.0.1:1")


def test_missing_data_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope" / "train.npz"
    argv = ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(missing), "--state-dir", str(tmp_path / "state")]
    assert_one_line_error(*run_main(capsys, *argv), "--data", str(missing), "does not exist")
    argv[5] = str(tmp_path)  # a folder without LEAF files
    assert_one_line_error(*run_main(capsys, *argv), str(tmp_path), ".json")
    assert not (tmp_path / "state").exists()


def test_missing_test_file_in_the_config(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, data, f'test = "{tmp_path / "test.npz"}"')
    line = assert_one_line_error(*run_main(capsys, "--config", str(config)), "test", "does not exist")
    assert str(config) in line


@pytest.mark.slow
def test_bad_broker_and_missing_data_in_a_subprocess(tmp_path: Path, data: Path) -> None:
    state = str(tmp_path / "state")
    proc = agent_cli("--broker", "localhost", "--run", "r", "--data", str(data), "--state-dir", state)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "--broker", "HOST:PORT", "'localhost'")
    proc = agent_cli("--broker", "localhost:1883", "--run", "r", "--data", "/nope/x.npz", "--state-dir", state)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "/nope/x.npz", "does not exist")
    proc = agent_cli("--broker", "localhost:1883", "--run", "r", "--data", str(tmp_path / "x.h5"), "--state-dir", state)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "x.h5")
    assert not (tmp_path / "state").exists()


# -- 6. TLS files ----------------------------------------------------------------------------------
def _openssl_pair(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate and its key (made with the site tooling's CA code)."""
    from server.site.certs import make_ca

    issued = make_ca(name)
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    return cert, key


def _tls_argv(tmp_path: Path, data: Path, *tls: str) -> list[str]:
    state = str(tmp_path / "state")
    return ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(data), "--state-dir", state, *tls]


@pytest.mark.slow
def test_missing_ca_file_is_named(tmp_path: Path, data: Path) -> None:
    proc = agent_cli(*_tls_argv(tmp_path, data, "--ca-certs", "/nope.crt"))
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "--ca-certs", "/nope.crt", "does not exist")
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_garbage_ca_file_is_named(tmp_path: Path, data: Path) -> None:
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    proc = agent_cli(*_tls_argv(tmp_path, data, "--ca-certs", str(garbage)))
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "--ca-certs", str(garbage), "PEM")
    assert not (tmp_path / "state").exists()


def test_tls_files_checked_one_by_one(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca, ca_key = _openssl_pair(tmp_path, "ca")
    cert, key = _openssl_pair(tmp_path, "client")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    locked = tmp_path / "locked.key"
    openssl = ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:secret", "-out", str(locked)]
    subprocess.run(openssl, check=True, capture_output=True)
    cases = [
        (["--ca-certs", str(tmp_path)], ["--ca-certs", str(tmp_path), "not a file"]),
        (["--ca-certs", str(ca), "--certfile", str(garbage), "--keyfile", str(key)], ["--certfile", str(garbage)]),
        (["--ca-certs", str(ca), "--certfile", str(cert), "--keyfile", str(garbage)], ["--keyfile", str(garbage)]),
        (["--ca-certs", str(ca), "--certfile", str(cert), "--keyfile", str(ca_key)], [str(cert), str(ca_key), "match"]),
        (["--ca-certs", str(ca), "--certfile", str(cert), "--keyfile", str(locked)], ["--keyfile", "passphrase"]),
        (["--ca-certs", str(ca), "--keyfile", str(key)], ["--keyfile", "--certfile"]),
        (["--ca-certs", str(ca), "--certfile", str(tmp_path / "no.crt")], ["--certfile", "no.crt", "does not exist"]),
    ]
    for tls, needles in cases:
        assert_one_line_error(*run_main(capsys, *_tls_argv(tmp_path, data, *tls)), *needles)
    assert not (tmp_path / "state").exists()
    # good files pass the check: the agent then fails only on the (absent) broker
    code, out, err = run_main(
        capsys, *_tls_argv(tmp_path, data, "--ca-certs", str(ca), "--certfile", str(cert), "--keyfile", str(key))
    )
    assert_one_line_error(code, out, err, "cannot reach the broker")


def test_tls_files_in_the_config_name_file_and_key(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, data, f'ca_certs = "{tmp_path / "ca.crt"}"')
    line = assert_one_line_error(*run_main(capsys, "--config", str(config)), "ca_certs", "ca.crt", "does not exist")
    assert str(config) in line


def test_a_library_link_gets_the_same_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"/nope\.crt does not exist"):
        MqttLink("lib", "127.0.0.1", 1, tls=TlsFiles(ca_certs="/nope.crt"))
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("junk")
    with pytest.raises(ConfigError, match=r"garbage\.crt"):
        MqttLink("lib", "127.0.0.1", 1, tls=TlsFiles(ca_certs=str(garbage)))


@pytest.mark.slow
def test_a_leaf_file_of_several_writers_names_the_setting_and_the_writers(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a file of the shared FEMNIST sample (5 writers), as a newcomer copies one to a board
    from covey.paths import femnist_dir

    file = sorted((femnist_dir() / "train").glob("*.json"))[0]
    writers = json.loads(file.read_text())["users"]
    argv = ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(file)]

    # Execute: no writer chosen, then one that is not in the file
    none = run_main(capsys, *argv)
    wrong = run_main(capsys, *argv, "--user", "f9999_99")

    # Assert: the setting to use (flag and config key) and the writers to choose from
    assert len(writers) == 5
    assert_one_line_error(*none, str(file), "5 writers", "--user", 'user = "', *writers)
    assert_one_line_error(*wrong, "'f9999_99'", "--user", *writers)
