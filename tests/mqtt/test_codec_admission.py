"""An ``int4`` run over a real mosquitto: an agent that cannot decode int4 deltas (one
from before them, which registers without ``codecs``) is told why and kept out, instead
of dropping every request and missing every deadline; an agent of this release joins."""

from __future__ import annotations

import time

import pytest

from device.data import class_counts, read_leaf
from device.mqtt import MqttLink
from device.protocol import Message, Register, Stop, Topics, decode_message
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_an_agent_without_int4_is_stopped_with_the_reason_and_a_current_one_joins(broker, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare: an int4 coordinator, and an old agent's registration (no codecs field)
    run, root = "codec-admission", femnist_root()
    coord = Coordinator(
        CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", codec="int4"),
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.01), clients_per_round=1),
        ensure_model("mlp_femnist"),
    )
    coord.connect()
    topics = Topics(run)
    old = MqttLink("old-agent", broker.host, broker.port, clean_session=True)
    old.connect(10)
    old.subscribe(topics.inbox("old"))
    counts = class_counts(next(iter(read_leaf(root / "train").values())).y, 62)
    body = Register(int(counts.sum()), 0, tuple(int(c) for c in counts), "ai_edge_litert", 100)
    assert body.codecs is None

    # Execute
    old.publish(topics.register("old"), Message.of(body, run=run, sender="old").encode(), wait=5)
    stops: list[Stop] = []
    deadline = time.monotonic() + 30
    while not stops and time.monotonic() < deadline:
        coord.pump(0.2)
        item = old.receive(0.2)
        if item is not None and isinstance(msg := decode_message(item.payload).body, Stop):
            stops.append(msg)
    stats = coord.backend.round_stats()
    with start_fleet(root, leaf_writers(root, 1), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        coord.wait_for_devices(1, 120)
        joined = sorted(coord.devices)
        coord.stop_devices()
    old.close()
    coord.close()

    # Assert
    assert stops, "the old agent got no stop within 30 s"
    assert "int4" in stops[0].reason and "update covey on the board" in stops[0].reason
    assert joined == ["dev000"]  # the current agent joined; the old one did not
    assert sum(stats.dropped.values()) >= 1  # the registration was dropped, with the reason logged
