"""Measured links over a real mosquitto: agents probe the server and each other.

Four agent processes and one device that registers but never answers a probe (a
peer that never answers). The coordinator measures: every agent-to-agent entry of
the RTT matrix and the agents' server links are measured, the silent device's entries
are filled (and say how), the log names the device that sent no report, and a
garbage or unsolicited link report is dropped and counted without stopping anything.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from device.protocol import LinkReport, Message, PathReport, Topics
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root, register_silent_device

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_links_are_measured_between_agents_and_filled_for_a_silent_peer(broker, tmp_path, caplog) -> None:
    from covey.paths import ensure_model

    # Prepare
    run, root = "links", femnist_root()
    agents = [f"dev{i:03d}" for i in range(4)]
    with start_fleet(root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        coord = Coordinator(
            CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", link_probe_timeout_s=1.0),
            make_strategy("dsc", train=TrainConfig(1, 10, 0.01), clients_per_round=5),
            ensure_model("mlp_femnist"),
        )
        coord.connect()
        ghost = register_silent_device(broker, run, "ghost")
        coord.wait_for_devices(5, 120)

        # Execute
        with caplog.at_level(logging.WARNING, logger="covey.server"):
            m = coord.measure_links(timeout=8.0)  # per device: the silent one is given up on after 8 s
            garbage = json.loads(
                Message.of(LinkReport("x", (PathReport("server", 3, 3, 1.0),)), run=run, sender="ghost").encode()
            )
            garbage["body"]["paths"][0]["rtt_ms"] = -5
            ghost.publish(Topics(run).results("ghost"), json.dumps(garbage).encode(), wait=5)
            unasked = Message.of(LinkReport("links9", (PathReport("server", 3, 3, 1.0),)), run=run, sender="ghost")
            ghost.publish(Topics(run).results("ghost"), unasked.encode(), wait=5)
            coord.pump(2.0)
            coord.pump(2.0)
            stats = coord.backend.round_stats()
            snr = coord.backend.snr_matrix()
        coord.stop_devices()
        ghost.close()
        coord.close()

    # Assert
    ids = list(m.ids)
    assert ids == sorted([*agents, "ghost"])
    a = [ids.index(d) for d in agents]
    g = ids.index("ghost")
    assert m.rtt_ms is not None and m.snr_db is not None and snr is not None
    for i in a:
        assert m.snr_source[i, i] == "measured" and np.isfinite(m.snr_db[i, i])
        for j in a:
            if i != j:
                assert m.rtt_source[i, j] == "measured" and 0 <= m.rtt_ms[i, j] < 5000
                assert m.snr_source[i, j] == "measured"
        # the silent peer: never echoed, never reported; filled through the server
        assert m.rtt_source[i, g] == m.rtt_source[g, i] == "via server"
        assert m.snr_source[i, g] == "worst measured"
    assert m.snr_source[g, g] == "worst measured"
    assert any("no link report from ghost" in r.getMessage() for r in caplog.records)
    assert sum(stats.dropped.values()) >= 2 and stats.rejected.get("ghost", 0) >= 2
    assert m.counts("rtt")["measured"] == 12
