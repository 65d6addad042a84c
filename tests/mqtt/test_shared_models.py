"""Shared start models: published once, retained, fetched by every member, then cleared."""

from __future__ import annotations

import json
import time

import pytest

from device.mqtt import MqttLink
from device.protocol import SERVER_ID, Topics, parse_frame
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _retained_under(broker, prefix: str, wait: float = 1.0) -> list[str]:  # type: ignore[no-untyped-def]
    """Topics a fresh subscriber to ``prefix/#`` receives as retained messages."""
    link = MqttLink("retained-probe", broker.host, broker.port, clean_session=True)
    link.connect(10)
    link.subscribe(f"{prefix}#")
    found: list[str] = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        item = link.receive(0.1)
        if item is not None and item.retain and item.payload:
            found.append(item.topic)
    link.close()
    return found


def test_parallel_round_sends_the_start_model_once_and_clears_it(broker, femnist_eval, observe, tmp_path) -> None:
    # Prepare
    from covey.paths import ensure_model

    run, n = "shared", 6
    topics = Topics(run)
    observer = observe(run)
    root = femnist_root()
    strategy = make_strategy("fedavg", train=TrainConfig(epochs=1, batch_size=10, lr=0.01), clients_per_round=n)

    # Execute
    with start_fleet(root, leaf_writers(root, n), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        coord = Coordinator(
            CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", deadline_s=60.0, seed=2),
            strategy,
            ensure_model("mlp_femnist"),
            femnist_eval,
        )
        coord.connect()
        coord.wait_for_devices(n, 120)
        coord.setup_strategy()
        metrics = [coord.step() for _ in range(2)]
        fed_acc, _ = coord.driver.federated_evaluation()  # also shared: one model for every device
        # clearing is asynchronous (QoS 1 publishes): poll until the broker holds none
        deadline = time.monotonic() + 15
        while (left_on_broker := _retained_under(broker, f"{topics.root}/shared/")) and time.monotonic() < deadline:
            pass
        coord.stop_devices()
        coord.close()

    # Verify
    assert all(m.trained == n and not m.dropped for m in metrics)
    assert metrics[-1].train_loss < metrics[0].train_loss  # the devices trained from the shared model
    assert 0.0 < fed_acc <= 1.0
    shared_frames = [parse_frame(p)[0] for t, p in observer.seen if t.startswith(f"{topics.root}/shared/") and p]
    keys = {h.extra.shared for h in shared_frames}
    assert len(keys) == 3  # one per round and one for the federated evaluation
    chunks_per_model = len({(h.msg_id, h.chunk) for h in shared_frames}) // len(keys)
    # the observer sees each chunk once: published once, not once per device
    assert len(shared_frames) == len(keys) * chunks_per_model
    server_models_to_devices = [
        t
        for t, p in observer.seen
        if "/device/" in t and t.endswith("/frames") and parse_frame(p)[0].sender == SERVER_ID
    ]
    assert server_models_to_devices == []
    assert left_on_broker == []
    assert not observer.problems
    # the model the devices downloaded is the stripped artifact (server/artifact.py)
    (manifest,) = [json.loads(p) for t, p in observer.seen if t == f"{topics.root}/artifact/manifest"]
    assert manifest["initial_weights"] is False
