"""Requests are checked in full before the agent acts on them; no message stops it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from device.agent import Agent, AgentConfig
from device.data import Dataset
from device.mqtt import Incoming
from device.protocol import (
    SERVER_ID,
    LocalTraining,
    ManagerHop,
    Message,
    Topics,
    TrainRequest,
)


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    data = Dataset(np.zeros((4, 60), np.float32), np.arange(4))
    a = Agent(AgentConfig("dev001", "run1", "127.0.0.1", 1, tmp_path, train_priority="normal"), data)
    yield a
    a.worker.close()


def _train_request(**changes: object) -> bytes:
    body = TrainRequest("t1", 0, 0, "parallel", SERVER_ID, ManagerHop(0), LocalTraining(1, 5, 0.01), seed=0)
    raw = json.loads(Message.of(body, run="run1", sender=SERVER_ID, round=1).encode())
    raw["body"].update(changes)
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shared": "r1-g0-abc"}, "train.body.shared must be a list"),
        ({"shared": [3]}, r"train.body.shared\[0\] must be a string"),
        ({"shared": ["r1/../x"]}, "model key"),
        ({"shared": [f"k{i}" for i in range(65)]}, "at most 64"),
        ({"group": None}, "train.body.group must be an integer, got None"),
        ({"train": {"epochs": 0, "batch": 5, "lr": 0.01}}, "train.body.train.epochs must be at least 1"),
        ({"next": {"to": "moon"}}, "train.body.next.to must be one of"),
        ({"seed": True}, "train.body.seed must be an integer"),
    ],
)
def test_bad_requests_are_refused_before_anything_changes(agent: Agent, changes: dict, message: str, caplog) -> None:
    # Prepare
    item = Incoming(Topics("run1").inbox("dev001"), _train_request(**changes), False)

    # Execute
    agent.handle(item)

    # Assert: dropped with the reason, counted, nothing waits and nothing was subscribed
    assert agent.stats.dropped == {"ProtocolError": 1}
    assert len(agent._waiting) == 0 and agent._shared_subscribed == set()
    assert any(re.search(message, r.getMessage()) for r in caplog.records), caplog.text


def test_a_good_request_waits_for_its_model_and_a_duplicate_is_dropped(agent: Agent) -> None:
    item = Incoming(Topics("run1").inbox("dev001"), _train_request(), False)
    agent.handle(item)
    agent.handle(item)  # QoS 1 redelivery
    assert "t1" in agent._waiting and len(agent._waiting) == 1
    assert agent.stats.dropped == {"duplicate request": 1}


@pytest.mark.parametrize(
    ("topic", "payload"),
    [
        ("covey/run1/device/dev001/inbox", b"\xff\xfe not json"),
        ("covey/run1/device/dev001/frames", b"CVY2" + b"\xff" * 20),
        ("covey/run1/device/dev001/frames/from/dev000", b"garbage"),
        ("covey/run1/artifact/manifest", b'{"model": 3}'),
        ("covey/run1/artifact/chunk/0", b"nope"),
        ("covey/run1/server/status", b"[1, 2]"),
        ("covey/run1/somewhere/else", b"x"),
    ],
)
def test_garbage_on_any_topic_is_dropped_and_the_agent_goes_on(agent: Agent, topic: str, payload: bytes) -> None:
    agent.handle(Incoming(topic, payload, False))
    assert sum(agent.stats.dropped.values()) == 1
    assert agent.running


def _artifact_items(run: str, model_bytes: bytes, manifest: dict) -> list[Incoming]:
    from device.protocol import encode_frames

    t = Topics(run)
    frames = encode_frames(
        np.frombuffer(model_bytes, np.uint8),
        kind="artifact",
        run=run,
        round=0,
        group=-1,
        sender=SERVER_ID,
        max_chunk=200_000,
    )
    items = [Incoming(t.artifact_chunk(i), f, True) for i, f in enumerate(frames)]
    return [*items, Incoming(t.artifact_manifest, json.dumps(manifest).encode(), True)]


def _status(run: str, epoch: str, sha: str) -> Incoming:
    from device.protocol import ServerStatus

    body = ServerStatus(epoch, "running", model_sha256=sha)
    return Incoming(Topics(run).server_status, Message.of(body, run=run, sender=SERVER_ID).encode(), True)


def test_a_new_coordinator_with_another_model_makes_the_agent_load_it(agent: Agent, zoo_model) -> None:
    from device.manifest import load_manifest, manifest_path_for
    from server.artifact import device_artifact

    # Prepare: two artifacts of the same architecture (stripped, and with initial values)
    path = zoo_model("mclr_synthetic")
    full_bytes, full_manifest = path.read_bytes(), load_manifest(manifest_path_for(path)).to_dict()
    stripped_bytes, stripped_manifest = device_artifact(full_bytes, full_manifest)
    assert stripped_manifest["sha256"] != full_manifest["sha256"]

    # Execute: the first coordinator's model, then a new coordinator (epoch) with the other
    for item in _artifact_items("run1", stripped_bytes, stripped_manifest):
        agent.handle(item)
    agent.handle(_status("run1", "e1", stripped_manifest["sha256"]))
    first = agent.model
    for item in _artifact_items("run1", full_bytes, full_manifest):
        agent.handle(item)
    still = agent.model
    agent.handle(_status("run1", "e2", full_manifest["sha256"]))

    # Assert
    assert first is not None and first.manifest.sha256 == stripped_manifest["sha256"]
    assert still is first  # a re-published artifact alone changes nothing mid-run
    assert agent.model is not None and agent.model.manifest.sha256 == full_manifest["sha256"]
    assert agent.stats.dropped == {}


def test_a_held_result_survives_a_restart_is_sent_again_on_a_repeated_request_and_goes_on_ack(
    tmp_path: Path, zoo_model
) -> None:
    from device.manifest import load_manifest, manifest_path_for
    from device.protocol import Ack
    from server.artifact import artifact_for_devices

    # Prepare: an agent with the model, trained on one request
    path = zoo_model("mclr_synthetic")
    model_bytes, manifest = artifact_for_devices(path, load_manifest(manifest_path_for(path)).to_dict())
    data = Dataset(np.random.default_rng(0).normal(size=(20, 60)).astype(np.float32), np.arange(20) % 10)

    def start() -> tuple[Agent, list[tuple[str, bytes]]]:
        a = Agent(AgentConfig("dev001", "run1", "127.0.0.1", 1, tmp_path, train_priority="normal"), data)
        sent: list[tuple[str, bytes]] = []
        a.link.publish = lambda topic, payload, retain=False, wait=None: sent.append((topic, payload))  # type: ignore[method-assign]
        for item in _artifact_items("run1", model_bytes, manifest):
            a.handle(item)
        return a, sent

    first, sent = start()
    request = Incoming(Topics("run1").inbox("dev001"), _train_request(), False)
    first.handle(request)
    start_weights = np.zeros(610, np.float32)
    from device.protocol import FrameExtra, encode_frames

    for frame in encode_frames(
        start_weights, kind="model", run="run1", round=1, group=0, sender=SERVER_ID, extra=FrameExtra("t1", position=0)
    ):
        first.handle(Incoming(Topics("run1").frames("dev001"), frame, False))
    trained = [p for t, p in sent if t == Topics("run1").uploads("dev001")]
    first.worker.close()

    # Execute: the device restarts; the coordinator (resumed) asks for the same task again
    second, resent = start()
    second.handle(request)
    outputs = [p for t, p in resent if t == Topics("run1").uploads("dev001")]
    results = [p for t, p in resent if t == Topics("run1").results("dev001")]
    ack = Message.of(Ack(("t1",)), run="run1", sender=SERVER_ID, round=1).encode()
    second.handle(Incoming(Topics("run1").inbox("dev001"), ack, False))

    # Assert: not trained twice, the same output and result went again, and the ack freed it
    from device.protocol import parse_frame

    # once when it restarted (it delivers what it holds) and once for the repeated request
    assert len(trained) == 1 and len(outputs) == 2
    assert {parse_frame(o)[0].sha256 for o in outputs} == {parse_frame(trained[0])[0].sha256}
    assert [json.loads(r)["body"]["task_id"] for r in results] == ["t1", "t1"]
    assert len({json.loads(r)["id"] for r in results}) == 1  # the held message itself, not a new result
    assert second.stats.dropped == {"duplicate request (result sent again)": 1}
    assert second.state.held == {} and not list((tmp_path / "held").iterdir())
    second.worker.close()
