"""Links measured on an emulated network: 3 sites x 4 boards, each site's links shaped
to a clearly different bandwidth with ``tbf`` (server/field/netns.py), the broker and
the coordinator on their own hosts. Nothing tells covey the topology: ``covey server
run`` measures Γ and RTT (docs/links.md), stores them in results.json, and DSC's primary
groups on the measured Γ are the three sites (adjusted Rand index 1.0).

Everything runs in network namespaces the test creates and removes, also on failure.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from device.data import class_counts, read_leaf
from server.broker import LOCAL_CONF, local_config_text
from server.field.netns import Lab, available
from server.fleet import leaf_writers
from server.grouping.dsc import dsc_groups
from tests.mqtt.conftest import femnist_root

REPO = Path(__file__).resolve().parents[2]
OK, WHY = available()
pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.skipif(not OK, reason=f"this machine cannot create network namespaces: {WHY}"),
]
SITES = {"a": 128.0, "b": 32.0, "c": 8.0}  # Mbit/s of every board's link at the site
PER_SITE = 4


def test_dsc_groups_the_sites_from_measured_links_alone(tmp_path: Path) -> None:
    # Prepare: the lab, the broker, one agent per board, each site's links shaped
    root = femnist_root()
    writers = leaf_writers(root, len(SITES) * PER_SITE)
    train = read_leaf(root / "train")
    boards = [f"{s}{i}" for s in SITES for i in range(1, PER_SITE + 1)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    run, port = "links-lab", 1883
    with Lab() as lab:
        broker = lab.add_host("broker")
        server = lab.add_host("server")
        hosts = {b: lab.add_host(b) for b in boards}
        for b, host in hosts.items():
            lab.shape(host, SITES[b[0]])
        conf = tmp_path / "mosquitto.conf"
        conf.write_text(local_config_text(LOCAL_CONF, port, broker.ip))
        lab.start(broker, ["mosquitto", "-c", str(conf)], log=tmp_path / "broker.log")
        lab.wait_for_port(server, broker.ip, port)
        for b, writer in zip(boards, writers, strict=True):
            agent = [sys.executable, "-m", "device.cli", "--broker", f"{broker.ip}:{port}", "--run", run]
            agent += ["--id", b, "--data", str(root / "train"), "--user", writer, "--state-dir", str(tmp_path / b)]
            lab.start(
                hosts[b],
                [*agent, "--threads", "1", "--idle-timeout", "300", "-v"],
                log=tmp_path / f"{b}.log",
                env=env,
                cwd=REPO,
            )

        # Execute: the coordinator as a site runs it; one DSC round after measuring
        done = lab.run(
            server,
            [
                *(sys.executable, "-m", "covey.cli", "server", "run", "--broker", f"{broker.ip}:{port}"),
                *("--run", run, "--strategy", "dsc", "--set", "clients_per_round=12", "--min-devices", "12"),
                *("--rounds", "1", "--epochs", "1", "--batch", "10", "--lr", "0.01", "--federated-eval-every", "0"),
                *("--state-dir", str(tmp_path / "state"), "--register-timeout", "300", "--deadline", "120"),
            ],
            timeout=900,
            env=env,
            cwd=REPO,
        )

    # Assert
    assert done.returncode == 0, done.stderr[-3000:]
    links = json.loads((tmp_path / "state" / "results.json").read_text())["links"]
    ids = links["ids"]
    assert ids == sorted(boards)
    n = len(ids)
    src = np.array(links["snr_source"], dtype=object)
    off = ~np.eye(n, dtype=bool)
    # every entry measured, or (a probe lost or timed implausibly fast) the other direction's
    assert set(src[off]) <= {"measured", "reverse"} and (np.diag(src) == "measured").all(), links["counts"]
    assert (src[off] == "measured").mean() >= 0.9, links["counts"]
    gamma = np.array(links["snr_db"], float)
    sym = (gamma + gamma.T) / 2  # what DSC does with the two directions
    counts = np.stack([class_counts(train[w].y, 62) for w in writers])
    primary, _ = dsc_groups(sym, counts, random_state=0)
    sites = [b[0] for b in ids]
    assert adjusted_rand_score(sites, primary) == 1.0, (np.round(sym, 1), primary)
    by_site = {s: float(np.mean([gamma[i, i] for i, b in enumerate(ids) if b[0] == s])) for s in SITES}
    assert by_site["a"] > by_site["b"] > by_site["c"], by_site  # the faster the link, the higher its SNR
