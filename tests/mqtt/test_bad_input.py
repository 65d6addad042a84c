"""Bad input at every receive is dropped, logged and counted; the run goes on."""

from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest

from device.mqtt import MqttLink
from device.protocol import (
    MAGIC,
    SERVER_ID,
    FrameExtra,
    LocalTraining,
    ManagerHop,
    Message,
    Register,
    Topics,
    TrainRequest,
    TrainResult,
    encode_frames,
)
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
N_PARAMS = 433_726


def _result_frames(run: str, sender: str, weights: np.ndarray, task: str = "nope") -> list[bytes]:
    return list(
        encode_frames(
            weights,
            kind="result",
            run=run,
            round=1,
            group=0,
            sender=sender,
            max_chunk=10**9,
            extra=FrameExtra(task, position=0),
        )
    )


def _rogue_traffic(run: str) -> list[tuple[str, bytes]]:
    """(topic, payload) of every kind of bad message; the broker here has no ACL, so the
    rogue may write anywhere (tests/site covers what the broker refuses)."""
    t = Topics(run)
    nan = np.zeros(N_PARAMS, np.float32)
    nan[0] = np.nan
    (good,) = _result_frames(run, "dev000", np.zeros(N_PARAMS, np.float32))
    counts = [1] * 62
    register = json.loads(Message.of(Register(62, 0, tuple(counts), "x", 1), run=run, sender="dev009").encode())
    result = TrainResult("nope", 1, 0.1, 1, 0, 0, tuple(counts))
    out = [
        (t.uploads("dev000"), good[:50]),  # truncated
        (t.uploads("dev000"), good[:-4] + b"\xff\xff\xff\xff"),  # wrong sha256
        (t.uploads("dev000"), _result_frames(run, "dev000", nan)[0]),  # NaN weights
        (t.uploads("dev000"), MAGIC + struct.pack("<I", 10**6) + b"{}"),  # oversized header
        (t.uploads("dev000"), _result_frames(run, "dev000", np.zeros(10, np.float32))[0]),  # wrong shape
        (t.uploads("dev001"), good),  # a frame claiming dev000 on dev001's topic
        (t.results("dev000"), b"{not json"),
        (t.results("dev000"), Message.of(result, run=run, sender="intruder", round=1).encode()),  # spoofed
        (t.results("intruder"), Message.of(result, run=run, sender="intruder", round=1).encode()),  # unknown
        (t.results("dev002"), Message.of(result, run=run, sender="dev002", round=99).encode()),  # stale
        (
            t.results("dev002"),
            json.dumps({**json.loads(Message.of(result, run=run, sender="dev002").encode()), "v": 7}).encode(),
        ),
        (t.register("dev009"), json.dumps({**register, "body": {**register["body"], "class_counts": "1,2"}}).encode()),
        (
            t.register("dev009"),
            json.dumps({**register, "body": {**register["body"], "class_counts": [[1], 2]}}).encode(),
        ),
        (t.register("dev009"), json.dumps({**register, "body": {**register["body"], "n_samples": "62"}}).encode()),
        (t.register("dev009"), json.dumps({**register, "body": {**register["body"], "class_counts": [1, 2]}}).encode()),
        (f"{t.root}/server/register", json.dumps({"type": "register", "sender": "old", "v": 1}).encode()),
    ]
    # to an agent: a hand-off from a device that is not its predecessor, a request not
    # from the server, and garbage
    for frame in encode_frames(
        np.zeros(N_PARAMS, np.float32),
        kind="handoff",
        run=run,
        round=1,
        group=0,
        sender="dev003",
        extra=FrameExtra("whatever", position=0),
    ):
        out.append((t.handoff("dev000", "dev003"), frame))
    request = TrainRequest("t", 0, 0, "parallel", SERVER_ID, ManagerHop(0), LocalTraining(1, 5, 0.01), 0)
    out.append((t.inbox("dev000"), Message.of(request, run=run, sender="dev003", round=1).encode()))
    out.append((t.inbox("dev000"), b"\x00\x01garbage"))
    return out


def test_coordinator_and_agents_drop_bad_input_and_finish(broker, femnist_eval, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare
    run, root = "badinput", femnist_root()
    with start_fleet(
        root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path / "logs"
    ) as fleet:
        strategy = make_strategy("fedgsp", train=TrainConfig(1, 5, 0.01), beta=1, kappa=1.0, growth="linear", alpha=0.0)
        coord = Coordinator(
            CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", deadline_s=60),
            strategy,
            ensure_model("mlp_femnist"),
            femnist_eval,
        )
        coord.connect()
        coord.wait_for_devices(4, timeout=120)
        coord.setup_strategy()
        rogue = MqttLink("rogue", broker.host, broker.port, clean_session=True)
        rogue.connect(10)
        traffic = _rogue_traffic(run)
        to_server = sum(1 for topic, _ in traffic if Topics(run).device_of(topic) or topic.endswith("/server/register"))

        # Execute: a round, the rogue traffic, then another round
        first = coord.step()
        for topic, payload in traffic:
            rogue.publish(topic, payload, wait=5)
        deadline = time.monotonic() + 30
        while sum(coord.bus.drops.by_reason.values()) < to_server:  # every one reaches the coordinator, then it goes on
            assert time.monotonic() < deadline, coord.bus.drops.by_reason
            coord.pump(0.5)
        second = coord.step()
        coord.stop_devices()
        coord.close()
        rogue.close()
        logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
        assert len(fleet.device_ids) == 4

    # Assert: every bad message was dropped and counted, the run went on unharmed
    assert sum(second.dropped.values()) == to_server, second.dropped
    assert "dev009" not in coord.devices  # no malformed registration got in
    assert all(m.trained == 4 and m.skipped == 0 for m in (first, second))
    assert second.server_accuracy > 0.05
    assert "dropped a message" in logs  # agents said why they dropped the rogue traffic
