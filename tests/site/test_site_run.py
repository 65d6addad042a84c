"""A whole field test on one machine, command for command as docs/site-guide.md tells it,
over TLS with per-device credentials.

``covey site init DIR`` makes the site; ``covey broker run --site DIR`` runs its
mosquitto; each board's bundle is installed by ``firmware_scripts/provision-device.sh
BUNDLE DATA TEST`` (here under a prefix per board, without systemd) and its agent runs
the command the script prints (``covey-device --config .../device.toml -v``);
``covey server run --site DIR`` runs FedGSP for 2 rounds with direct hand-offs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from covey.cli import main
from device.data import read_leaf
from server.broker import free_port, wait_for_port
from server.fleet import leaf_writers
from tests.mqtt.conftest import femnist_root

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.broker, pytest.mark.slow]
DEVICES = ["pi-1", "pi-2", "pi-3", "pi-4"]


def provision(bundle: Path, board: Path, data: Path, test: Path, env: dict[str, str]) -> list[str]:
    """provision-device.sh as on a board without systemd; returns the agent command it prints."""
    env = {**env, "COVEY_PREFIX": str(board), "COVEY_SYSTEMD": "no", "COVEY_DEVICE": covey_device()}
    script = REPO / "firmware_scripts" / "provision-device.sh"
    done = subprocess.run([str(script), str(bundle), str(data), str(test)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip().splitlines()[-1].split("run the agent with: ", 1)[1]
    assert command == f"{covey_device()} --config {board}/etc/covey/device.toml -v"
    return command.split()


def covey_device() -> str:
    """The installed ``covey-device`` beside this interpreter (as install-device.sh makes it)."""
    return str(Path(sys.executable).parent / "covey-device")


def test_a_site_runs_fedgsp_over_tls_as_the_guide_tells_it(site_parent: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: each board's data as the .npz files a board holds
    root, port, site = femnist_root(), free_port(), site_parent / "site"
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    data = {}
    for device, writer in zip(DEVICES, leaf_writers(root, len(DEVICES)), strict=True):
        (tmp_path / device).mkdir()
        data[device] = (tmp_path / device / "train.npz", tmp_path / device / "test.npz")
        np.savez(data[device][0], x=train[writer].x, y=train[writer].y)
        np.savez(data[device][1], x=test[writer].x, y=test[writer].y)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    processes: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            processes.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
        return processes[-1]

    # Execute: the broker host
    init = ["site", "init", str(site), "--host", "localhost", "--ip", "127.0.0.1", "--port", str(port)]
    assert main([*init, "--run", "field", "--devices", *DEVICES]) == 0
    state = tmp_path / "state"
    try:
        broker = start(
            [sys.executable, "-m", "covey.cli", "broker", "run", "--site", str(site)], tmp_path / "broker.log"
        )
        wait_for_port("127.0.0.1", port, 15, broker)
        # each board: its bundle installed, its agent started as provision-device.sh says
        for device in DEVICES:
            board = site_parent / f"board-{device}"
            command = provision(site / "devices" / device, board, *data[device], env)
            start(command, tmp_path / f"{device}.log")
        # the coordinator
        code = main(
            [
                "server",
                "run",
                "--site",
                str(site),
                "--strategy",
                "fedgsp",
                "--min-devices",
                "4",
                "--rounds",
                "2",
                "--set",
                "beta=1",
                "--set",
                "kappa=1.0",
                "--set",
                "growth=linear",
                "--set",
                "alpha=0",
                "--handoff",
                "direct",
                "--eval-data",
                str(root),
                "--state-dir",
                str(state),
                "--register-timeout",
                "120",
            ]
        )
    finally:
        for proc in reversed(processes):  # agents first, the broker last; SIGTERM as systemd sends it
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    broker_status = processes[0].returncode

    # Assert: both rounds with every device, hand-offs device to device, results written
    assert code == 0
    assert broker_status == 0, (tmp_path / "broker.log").read_text()
    result = json.loads((state / "results.json").read_text())
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    assert all(r["trained"] == 4 and r["skipped"] == 0 for r in result["rounds"])
    assert all(0 < r["server_accuracy"] <= 1 for r in result["rounds"])
    assert all(r["handoff"].get("direct", 0) > 0 for r in result["rounds"])
    assert (state / "results.csv").exists() and (state / "results.png").exists()
    for device in DEVICES:  # each agent ran from its installed bundle: its id, its state folder
        log = (tmp_path / f"{device}.log").read_text()
        assert f"{device}: connected to the broker at localhost:{port} over TLS as {device}, run field" in log
        assert f"{device}: registered" in log, log[-2000:]
        assert (site_parent / f"board-{device}" / "var" / "lib" / "covey" / device).is_dir()
    assert (site / "broker" / "data" / "mosquitto.db").exists()  # persistence is on, inside the site
    assert "results.json" in capsys.readouterr().out


# What the test above runs of docs/site-guide.md, and the test that runs each other command.
GUIDE = {
    "firmware_scripts/install-server.sh /opt/covey-server": "test_trial.py (under a temporary prefix)",
    "covey site init DIR --host HOST --ip ADDR --devices ID1 ID2 ID3 ID4": (
        "above (with --port, --run); test_multihost.py (--ip only, across network namespaces)"
    ),
    "covey broker run --site DIR": "above; test_multihost.py (on the broker's own host); test_trial.py",
    "sudo firmware_scripts/broker-setup.sh DIR --host HOST --ip ADDR --devices ID1 ID2 ID3 ID4": "test_scripts.py",
    "firmware_scripts/install-device.sh /opt/covey": (
        "tests/boards (on emulated arm64 and armhf boards, as the images are built and at every session) and "
        "test_trial.py (x86_64, under a temporary prefix)"
    ),
    "firmware_scripts/provision-device.sh BUNDLE DATA TEST": (
        "above, test_multihost.py (under a prefix) and tests/boards/test_site_run.py (on the emulated boards)"
    ),
    "/opt/covey/venv/bin/covey-device --config /etc/covey/device.toml -v": (
        "above, test_multihost.py (the command provision prints, on each board's host) and "
        "tests/boards/test_site_run.py (on the emulated boards, as /etc/covey)"
    ),
    "covey server run --site DIR --strategy fedgsp --min-devices 4 --rounds 20 --eval-data EVAL --state-dir STATE": (
        "above and test_multihost.py (2 rounds, on the coordinator's own host)"
    ),
    "covey site add-edge DIR lab --host EDGE_HOST --ip EDGE_ADDR --devices ID1 ID2": (
        "test_edge.py (--host localhost --ip 127.0.0.1, with --port)"
    ),
    "covey edge run --site DIR --edge lab": "test_edge.py (the room's boards train through it, its group at the edge)",
    "covey field-test examples/topologies/two-rooms.toml --strategy hierfavg --rounds 2": (
        "test_field_edges.py (with --out)"
    ),
    # "A trial on one machine": test_trial.py reads these from the guide and runs them as they are
    "covey site init DIR --host localhost --ip 127.0.0.1 --devices trial-1 trial-2 trial-3": "test_trial.py",
    "covey site sample-data DIR": "test_trial.py",
    "for ID in trial-1 trial-2 trial-3; do firmware_scripts/provision-device.sh --prefix BOARDS/$ID DIR/devices/$ID "
    "DIR/devices/$ID/train.npz DIR/devices/$ID/test.npz; done": "test_trial.py",
    "/opt/covey/venv/bin/covey-device --config BOARDS/ID/etc/covey/device.toml -v": "test_trial.py",
    "covey server run --site DIR --strategy fedgsp --min-devices 3 --rounds 5 --eval-data EVAL --state-dir STATE": (
        "test_trial.py"
    ),
}


def test_the_guide_holds_the_commands_the_tests_run() -> None:
    """A command added to or changed in the guide must be added to a test (and here)."""
    text = (REPO / "docs" / "site-guide.md").read_text()
    blocks = text.split("```sh\n")[1:]
    commands = [line for block in blocks for line in block.split("```", 1)[0].splitlines() if line.strip()]
    assert list(dict.fromkeys(commands)) == list(GUIDE)
