"""A site across hosts: the broker, the coordinator and four boards each in its own
network namespace on a virtual LAN (server/field/netns.py), configured only by
``covey site init`` and each board's bundle, as docs/site-guide.md tells it, over
TLS with per-device credentials; FedGSP with direct hand-offs finishes.

The boards dial the broker by its LAN address (the site is made with ``--ip`` only,
so the certificate must hold it); nothing of the lab touches the machine's own
network, and the lab is removed afterwards, also when the test fails.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from device.data import read_leaf
from server.field.netns import Lab
from server.fleet import leaf_writers
from tests.lab_marks import LAB_MARKS
from tests.mqtt.conftest import femnist_root
from tests.site.test_site_run import covey_device

REPO = Path(__file__).resolve().parents[2]
pytestmark = LAB_MARKS
BOARDS = ["pi-1", "pi-2", "pi-3", "pi-4"]
COVEY = [sys.executable, "-m", "covey.cli"]


def _boards_data(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    root = femnist_root()
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    out = {}
    for board, writer in zip(BOARDS, leaf_writers(root, len(BOARDS)), strict=True):
        (tmp_path / board).mkdir()
        out[board] = (tmp_path / board / "train.npz", tmp_path / board / "test.npz")
        np.savez(out[board][0], x=train[writer].x, y=train[writer].y)
        np.savez(out[board][1], x=test[writer].x, y=test[writer].y)
    return out


def test_a_site_on_five_hosts_runs_fedgsp_over_tls_from_the_guide(site_parent: Path, tmp_path: Path) -> None:
    data = _boards_data(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    site, state = site_parent / "site", tmp_path / "state"
    with Lab() as lab:
        broker_host, coordinator = lab.add_host("broker"), lab.add_host("coord")
        boards = {b: lab.add_host(b) for b in BOARDS}

        # 1. the broker host makes the site for its LAN address and runs the broker
        made = lab.run(
            broker_host,
            [*COVEY, "site", "init", str(site), "--ip", broker_host.ip, "--run", "field", "--devices", *BOARDS],
            env=env,
            cwd=REPO,
        )
        assert made.returncode == 0, made.stderr
        lab.start(
            broker_host, [*COVEY, "broker", "run", "--site", str(site)], log=tmp_path / "broker.log", env=env, cwd=REPO
        )

        # 2. each board installs its bundle and runs the agent as provision-device.sh says
        for board, host in boards.items():
            prefix = site_parent / f"board-{board}"
            provision = lab.run(
                host,
                [
                    str(REPO / "firmware_scripts" / "provision-device.sh"),
                    str(site / "devices" / board),
                    str(data[board][0]),
                    str(data[board][1]),
                ],
                env={**env, "COVEY_PREFIX": str(prefix), "COVEY_SYSTEMD": "no", "COVEY_DEVICE": covey_device()},
            )
            assert provision.returncode == 0, provision.stderr
            command = provision.stdout.strip().splitlines()[-1].split("run the agent with: ", 1)[1].split()
            lab.start(host, command, log=tmp_path / f"{board}.log", env=env, cwd=REPO)

        # 3. the coordinator, on its own host, runs from the site folder
        run = lab.run(
            coordinator,
            [
                *COVEY,
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
                str(femnist_root()),
                "--state-dir",
                str(state),
                "--register-timeout",
                "120",
            ],
            env=env,
            cwd=REPO,
            timeout=600,
        )

    # Assert: both rounds, every board, hand-offs board to board, all over TLS to the broker's LAN address
    assert run.returncode == 0, run.stderr[-3000:]
    rounds = json.loads((state / "results.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["trained"] == 4 and r["skipped"] == 0 for r in rounds)
    assert all(r["handoff"].get("direct", 0) > 0 for r in rounds)
    assert all(0 < r["server_accuracy"] <= 1 for r in rounds)
    for board in BOARDS:
        log = (tmp_path / f"{board}.log").read_text()
        assert f"{board}: connected to the broker at {broker_host.ip}:8883 over TLS as {board}" in log, log[-2000:]
    assert "New client connected from 10.77.0." in (tmp_path / "broker.log").read_text()
