"""FedGSP end to end: 12 agent processes over a real mosquitto, every message on the
broker checked against the protocol; direct and relayed hand-offs on the loopback broker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from device.protocol import TrainResult
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root, loopback_fleet, where

pytestmark = [pytest.mark.slow]

TRAIN = TrainConfig(epochs=1, batch_size=5, lr=0.01)


def run_fedgsp(broker, eval_data, tmp: Path, run: str, handoff: str, rounds: int, n_devices: int = 12):  # type: ignore[no-untyped-def]
    """FedGSP (f = 2, 2, 4, 4, ... groups, κ = 1) over ``n_devices`` agents; returns the
    coordinator. ``broker``: mosquitto's handle (agent processes), or None for the
    loopback broker (agents in this process)."""
    from covey.paths import ensure_model

    root = femnist_root()
    model = ensure_model("mlp_femnist")
    writers = leaf_writers(root, n_devices)
    fleet = (
        loopback_fleet(root, writers, run=run, state_dir=tmp / f"agents-{run}")
        if broker is None
        else start_fleet(root, writers, run=run, host=broker.host, port=broker.port, log_dir=tmp / f"logs-{run}")
    )
    with fleet as started:
        host, port, link = where(started if broker is None else broker)
        strategy = make_strategy("fedgsp", train=TRAIN, growth="log", alpha=1.0, beta=2, kappa=1.0)
        coord = Coordinator(
            CoordinatorConfig(run, host, port, tmp / f"state-{run}", handoff=handoff, deadline_s=60.0, seed=4),
            strategy,
            model,
            eval_data,
            **link,
        )
        coord.connect()
        coord.wait_for_devices(n_devices, timeout=120)
        coord.measure_rtt()
        coord.setup_strategy()
        for _ in range(rounds):
            coord.step()
        coord.stop_devices()
        coord.close()
    assert len(coord.devices) == n_devices
    return coord


@pytest.mark.broker
def test_fedgsp_over_mqtt_with_12_agents(broker, femnist_eval, observe, tmp_path) -> None:
    # Prepare
    observer = observe("e2e")

    # Execute
    coord = run_fedgsp(broker, femnist_eval, tmp_path, "e2e", handoff="mixed", rounds=5)
    observer.wait_for(lambda seen: sum(t.endswith("/results") for t, _ in seen) >= 72, timeout=10)  # 60 + 12 pongs

    # Assert: every sampled device trained exactly once per round, in chains of >= 3
    results = [m for m in observer.messages("/results") if isinstance(m.body, TrainResult)]
    for rnd in range(1, 6):
        trained = sorted(m.sender for m in results if m.round == rnd)
        assert trained == sorted(coord.devices), f"round {rnd}: {trained}"
    assert all(m.trained == m.participants == 12 and m.skipped == 0 for m in coord.records)
    assert [m.n_groups for m in coord.records] == [2, 2, 4, 4, 4]  # chains of 6, then of 3
    # both hand-off modes were used, server-side accuracy rose
    assert sum(m.handoff.get("direct", 0) for m in coord.records) > 0
    assert sum(m.handoff.get("relay", 0) for m in coord.records) > 0
    assert coord.records[-1].server_accuracy > coord.records[0].server_accuracy + 0.1
    # only protocol frames and messages crossed the broker, nothing was dropped
    assert observer.problems == []
    assert len(observer.seen) > 100
    assert all(not m.dropped for m in coord.records)
    assert (tmp_path / "state-e2e" / "checkpoint.json").exists()


def test_direct_and_relayed_hand_offs_give_the_same_model(femnist_eval, tmp_path) -> None:
    """On the loopback broker: the coordinator's and the agents' own code, in this process."""
    direct = run_fedgsp(None, femnist_eval, tmp_path, "same-direct", handoff="direct", rounds=2, n_devices=6)
    relay = run_fedgsp(None, femnist_eval, tmp_path, "same-relay", handoff="relay", rounds=2, n_devices=6)

    assert all(m.handoff == {"direct": m.n_groups} for m in direct.records)
    assert all(m.handoff == {"relay": m.n_groups} for m in relay.records)
    np.testing.assert_array_equal(direct.strategy.global_weights, relay.strategy.global_weights)
