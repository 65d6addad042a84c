"""One device's link goes down mid-round (the link emulator's relay cuts it and refuses
it for a few seconds, as a board walking out of range): the run finishes every round,
and the device is back and training once its link returns."""

from __future__ import annotations

import pytest

from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.field.relay import Impairment, Relay
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_a_link_outage_mid_round_is_survived(broker, femnist_eval, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare: dev003 reaches the broker through a relay with 20 ms each way
    run, root = "outage", femnist_root()
    writers = leaf_writers(root, 4)
    relay = Relay(("127.0.0.1", 0), (broker.host, broker.port), Impairment(latency_ms=20), seed=0).start()
    try:
        with (
            start_fleet(root, writers[:3], run=run, host=broker.host, port=broker.port, log_dir=tmp_path),
            start_fleet(
                root, writers[3:], run=run, host="127.0.0.1", port=relay.port, log_dir=tmp_path, device_ids=["dev003"]
            ),
        ):
            coord = Coordinator(
                CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", deadline_s=30.0),
                make_strategy("fedavg", train=TrainConfig(1, 10, 0.01), clients_per_round=4),
                ensure_model("mlp_femnist"),
                femnist_eval,
            )
            coord.connect()
            coord.wait_for_devices(4, 120)
            coord.setup_strategy()

            # Execute: the outage starts as round 2 is sent out
            records = [coord.step()]
            relay.outage(3.0)
            records += [coord.step(), coord.step()]
            coord.stop_devices()
            coord.close()
    finally:
        relay.stop()

    # Assert
    assert [r.round for r in records] == [1, 2, 3]
    assert "dev003" in records[0].trained_ids and "dev003" in records[2].trained_ids  # back after the outage
    assert relay.connections >= 2  # it reconnected through the relay
    assert all(r.trained >= 3 for r in records)
