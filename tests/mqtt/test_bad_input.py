"""Bad input at every receive is dropped, logged and counted; the run goes on."""

from __future__ import annotations

import json
import struct
import threading
import time

import numpy as np
import pytest

from device.mqtt import MqttLink
from device.protocol import MAGIC, Message, Topics, encode_frames
from server.coordinator.coordinator import Coordinator, CoordinatorConfig
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _corrupt_sha(frame: bytes) -> bytes:
    return frame[:-4] + b"\xff\xff\xff\xff"


def test_coordinator_and_agents_drop_bad_input_and_finish(broker, femnist_eval, tmp_path) -> None:
    from covey.paths import ensure_model

    run, root = "badinput", femnist_root()
    topics = Topics(run)
    model = ensure_model("mlp_femnist")
    n_params = 433_726
    with start_fleet(
        root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path / "logs"
    ) as fleet:
        strategy = make_strategy("fedgsp", train=TrainConfig(1, 5, 0.01), beta=1, kappa=1.0, growth="linear", alpha=0.0)
        coord = Coordinator(
            CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", deadline_s=60),
            strategy,
            model,
            femnist_eval,
        )
        coord.connect()
        coord.wait_for_devices(4, timeout=120)
        coord.setup_strategy()
        rogue = MqttLink("rogue", broker.host, broker.port, clean_session=True)
        rogue.connect(10)

        def attack() -> None:
            time.sleep(0.2)
            good = list(
                encode_frames(
                    np.zeros(n_params, np.float32),
                    kind="result",
                    run=run,
                    round=1,
                    group=0,
                    sender="dev000",
                    extra={"task_id": "nope"},
                )
            )
            nan = np.zeros(n_params, np.float32)
            nan[0] = np.nan
            other = list(
                encode_frames(
                    np.ones(n_params, np.float32),
                    kind="result",
                    run=run,
                    round=1,
                    group=0,
                    sender="dev000",
                    extra={"task_id": "nope2"},
                )
            )
            for frame in other[:-1]:
                rogue.publish(topics.group_frames(0), frame)
            bad = {
                "truncated frame": good[0][:50],
                "wrong sha256": _corrupt_sha(other[-1]),
                "NaN weights": b"".join(
                    encode_frames(nan, kind="result", run=run, round=1, group=0, sender="dev001", max_chunk=10**9)
                ),
                "oversized header": MAGIC + struct.pack("<I", 10**6) + b"{}",
                "wrong shape": b"".join(
                    encode_frames(
                        np.zeros(10, np.float32),
                        kind="result",
                        run=run,
                        round=1,
                        group=0,
                        sender="dev001",
                        max_chunk=10**9,
                    )
                ),
            }
            for payload in bad.values():
                rogue.publish(topics.group_frames(0), payload)
            rogue.publish(topics.results, b"{not json")
            rogue.publish(topics.results, Message("result", run, "intruder", 1, {"task_id": "x"}).encode())
            rogue.publish(topics.results, Message("result", run, "dev002", 99, {"task_id": "x"}).encode())
            old = Message("result", run, "dev002", 1, {"task_id": "x"})
            rogue.publish(topics.results, json.dumps({**json.loads(old.encode()), "v": 7}).encode())
            # to an agent: a hand-off from a device that is not its predecessor, and a stale frame
            for frame in encode_frames(
                np.zeros(n_params, np.float32),
                kind="handoff",
                run=run,
                round=1,
                group=0,
                sender="dev003",
                extra={"task_id": f"{run}-r1-g0-p0"},
            ):
                rogue.publish(topics.frames("dev000"), frame)
            rogue.publish(topics.inbox("dev000"), Message("train", run, "dev003", 1, {"task_id": "t"}).encode())
            rogue.publish(topics.inbox("dev000"), b"\x00\x01garbage")

        first = coord.step()
        attacker = threading.Thread(target=attack)
        attacker.start()
        attacker.join()
        drain_until = time.monotonic() + 5.0  # let every rogue message reach the coordinator
        while time.monotonic() < drain_until:
            coord.pump(0.1)
        between_rounds = dict(coord._dropped)
        second = coord.step()
        metrics = [first, second]
        coord.stop_devices()
        time.sleep(0.5)
        coord.close()
        rogue.close()
        logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
        assert len(fleet.device_ids) == 4

    dropped = dict(between_rounds)
    for m in metrics:
        for reason, n in m.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    assert sum(dropped.values()) >= 9, dropped
    assert all(m.trained == 4 and m.skipped == 0 for m in metrics)  # the run went on unharmed
    assert metrics[-1].test_accuracy > 0.05
    assert "dropped a message" in logs  # agents said why they dropped the rogue traffic
