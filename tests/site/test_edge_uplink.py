"""A room behind its edge keeps training through an uplink cut (issue 28, "faults at the
edge"): the central broker, the edge, the coordinator and two boards each on their own
host in network namespaces, made by ``covey site init`` and ``covey site add-edge`` and
run by ``covey edge run`` as docs/site-guide.md tells it. Mid-run, the
edge's host loses its route to the central broker for a minute (a blackhole route in
the edge's namespace): the central broker drops the silent bridge after its keep-alive
(1.5 x 30 s), the bridge reconnects with its session kept once the route is back, and
what was held on either side crosses. The round in flight waits (its deadline is 180 s)
and every round finishes with both boards, none skipped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from device.data import read_leaf
from server.field.netns import Lab
from server.fleet import leaf_writers
from tests.lab_marks import LAB_MARKS
from tests.mqtt.conftest import femnist_root

REPO = Path(__file__).resolve().parents[2]
pytestmark = LAB_MARKS
BOARDS = ["lab-1", "lab-2"]
COVEY = [sys.executable, "-m", "covey.cli"]
CUT_S = 60.0


def test_a_room_keeps_training_through_a_minute_long_uplink_cut(site_parent: Path, tmp_path: Path) -> None:
    # Prepare: each board's data, as the .npz files a board holds
    root = femnist_root()
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    data = {}
    for board, writer in zip(BOARDS, leaf_writers(root, len(BOARDS)), strict=True):
        data[board] = (tmp_path / f"{board}-train.npz", tmp_path / f"{board}-test.npz")
        np.savez(data[board][0], x=train[writer].x, y=train[writer].y)
        np.savez(data[board][1], x=test[writer].x, y=test[writer].y)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "COVEY_TRAIN_PRIORITY": "normal"}
    site, state = site_parent / "site", tmp_path / "state"
    results = state / "results.json"
    with Lab() as lab:
        central, edge, coordinator = lab.add_host("central"), lab.add_host("edge"), lab.add_host("coord")
        boards = {b: lab.add_host(b) for b in BOARDS}
        made = lab.run(central, [*COVEY, "site", "init", str(site), "--ip", central.ip, "--devices", *BOARDS], env=env)
        assert made.returncode == 0, made.stderr
        added = lab.run(
            central, [*COVEY, "site", "add-edge", str(site), "lab", "--ip", edge.ip, "--devices", *BOARDS], env=env
        )
        assert added.returncode == 0, added.stderr
        lab.start(central, [*COVEY, "broker", "run", "--site", str(site)], log=tmp_path / "central.log", env=env)
        lab.wait_for_port(coordinator, central.ip, 8883)
        edge_broker = [*COVEY, "edge", "run", "--site", str(site), "--edge", "lab"]
        lab.start(edge, edge_broker, log=tmp_path / "edge.log", env=env)
        for board, host in boards.items():
            lab.wait_for_port(host, edge.ip, 8883)
            agent = [sys.executable, "-m", "device.cli", "--config", str(site / "devices" / board / "device.toml")]
            lab.start(
                host,
                [*agent, "--data", str(data[board][0]), "--test", str(data[board][1])],
                env=env,
                log=tmp_path / f"{board}.log",
            )
        run = [*COVEY, "server", "run", "--site", str(site), "--strategy", "fedavg", "--set", "clients_per_round=2"]
        run += ["--min-devices", "2", "--rounds", "4", "--epochs", "5", "--deadline", "180"]
        run += ["--federated-eval-every", "0", "--state-dir", str(state), "--register-timeout", "120"]
        server = lab.start(coordinator, run, log=tmp_path / "server.log", env=env)

        # Execute: once round 1 is on record, the edge loses its route to the central broker
        deadline = time.monotonic() + 300
        while not _rounds(results) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _rounds(results), (tmp_path / "server.log").read_text()[-3000:]
        cut = lab.run(edge, ["ip", "route", "add", "blackhole", f"{central.ip}/32"])
        assert cut.returncode == 0, cut.stderr
        cut_at = time.monotonic()
        while time.monotonic() - cut_at < CUT_S:
            time.sleep(0.5)
        restored = lab.run(edge, ["ip", "route", "del", "blackhole", f"{central.ip}/32"])
        assert restored.returncode == 0, restored.stderr
        code = server.wait(300)

    # Assert: every round with both boards, none skipped; one round waited out the cut
    assert code == 0, (tmp_path / "server.log").read_text()[-3000:]
    rounds = json.loads(results.read_text())["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert all(r["trained"] == 2 and r["skipped"] == 0 for r in rounds), rounds
    assert max(r["wall_s"] for r in rounds[1:]) >= CUT_S / 2, [r["wall_s"] for r in rounds]


def _rounds(results: Path) -> list[object]:
    try:
        return list(json.loads(results.read_text()).get("rounds", []))
    except (OSError, ValueError):
        return []
