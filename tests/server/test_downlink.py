"""Downlink deltas (server/downlink.py): a start model goes as an int8 delta against the
model the device holds, the device decodes exactly what the server expects, and a full
model goes whenever the server cannot be sure what the device holds."""

from __future__ import annotations

import numpy as np
import pytest

from device.errors import ProtocolError
from device.protocol import (
    DELTA_CODECS,
    SERVER_ID,
    FrameExtra,
    LocalTraining,
    ManagerHop,
    Reassembler,
    TrainRequest,
    encode_frames,
)
from device.waiting import WaitingTasks
from server.downlink import Downlink, DownlinkModels

N = 3_000


def _model(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, N).astype(np.float32)


def _deliver(waiting: WaitingTasks, down: Downlink, task_id: str, discard_start: bool = False) -> np.ndarray:
    """``down`` as a device gets it: a train request (in other than int8 runs:
    ``discard_start``), then the model frame(s)."""
    request = TrainRequest(
        task_id, 0, 0, "parallel", SERVER_ID, ManagerHop(0), LocalTraining(1, 5, 0.01), 0, discard_start=discard_start
    )
    waiting.add(request, 1)
    frames = encode_frames(
        down.payload,
        kind="model",
        run="r",
        round=1,
        group=0,
        sender=SERVER_ID,
        extra=FrameExtra(task_id),
        codec=down.codec,
        base=down.base,
    )
    reassembler = Reassembler()
    payloads = [p for p in (reassembler.add(f) for f in frames) if p is not None]
    (ready,) = waiting.accept(payloads[0], N)
    assert ready.key == down.key
    assert ready.weights is not None
    return ready.weights


def test_a_device_that_answered_gets_the_next_model_as_a_delta_and_decodes_what_the_server_expects() -> None:
    server, device = DownlinkModels("fp16", deltas=True), WaitingTasks()
    first = server.encode("dev1", _model(0))
    assert first.codec == "fp16" and first.base is None  # nothing held yet: the full model
    server.sent("dev1", "t1", first.key)
    assert np.array_equal(_deliver(device, first, "t1"), first.received)
    server.confirm("dev1", "t1")
    target = _model(0) + 0.01 * _model(1)  # the next round's model
    second = server.encode("dev1", target)
    assert second.codec in DELTA_CODECS and second.base == first.key
    assert second.payload.nbytes < first.payload.nbytes / 1.9
    got = _deliver(device, second, "t2")
    assert np.array_equal(got, second.received)  # bit for bit what the server will delta against next
    assert np.abs(got - target).max() <= np.abs(target - first.received).max() / 255  # one step
    assert list(device.held) == [second.key]  # the device keeps only the latest


def test_a_device_keeps_its_start_model_only_when_the_next_may_be_a_delta_against_it() -> None:
    server, device = DownlinkModels("fp16", deltas=False), WaitingTasks()
    full = server.encode("dev1", _model(0))
    _deliver(device, full, "t1", discard_start=True)  # an fp16 run: no deltas will come
    assert device.held == {}  # nothing references the start model: the task may train into it
    _deliver(device, full, "t2")  # a coordinator that does not say so: the device keeps it
    assert list(device.held) == [full.key]


def test_a_full_model_goes_when_the_server_cannot_know_what_the_device_holds() -> None:
    server = DownlinkModels("fp16", deltas=True)
    down = server.encode("dev1", _model(0))
    server.sent("dev1", "t1", down.key)
    assert server.encode("dev1", _model(1)).codec == "fp16"  # not confirmed yet
    server.confirm("dev1", "t0")  # an answer to another task confirms nothing
    assert server.base_of("dev1") is None
    server.confirm("dev1", "t1")
    assert server.base_of("dev1") == down.key
    server.sent("dev1", "t2", "f" * 64)  # sent again, unanswered: the device may hold either
    assert server.encode("dev1", _model(1)).codec == "fp16"
    other = DownlinkModels("fp16", deltas=True, capacity=1)
    a = other.encode("dev1", _model(0))
    other.sent("dev1", "t1", a.key)
    other.confirm("dev1", "t1")
    other.encode("dev2", _model(5))  # evicts dev1's model from a cache of one
    assert other.encode("dev1", _model(1)).codec == "fp16"
    plain = DownlinkModels("fp16", deltas=False)  # fp16 runs: always full
    plain.sent("dev1", "t1", plain.encode("dev1", _model(0)).key)
    plain.confirm("dev1", "t1")
    assert plain.encode("dev1", _model(1)).codec == "fp16"


def test_a_delta_against_a_model_the_device_does_not_hold_is_refused_with_the_reason() -> None:
    server = DownlinkModels("fp16", deltas=True)
    first = server.encode("dev1", _model(0))
    server.sent("dev1", "t1", first.key)
    server.confirm("dev1", "t1")
    delta = server.encode("dev1", _model(1))
    assert delta.codec in DELTA_CODECS
    with pytest.raises(ProtocolError, match="does not hold"):
        _deliver(WaitingTasks(), delta, "t2")  # a restarted device holds nothing


def test_the_group_manager_sends_a_delta_to_a_member_that_answered_and_the_broadcast_to_the_others() -> None:
    from device.protocol import Topics, TrainResult, decode_message, parse_frame
    from server.coordinator.manager import GroupManager
    from server.coordinator.shared import SharedModels
    from server.strategies.base import GroupPlan, TrainConfig

    sent: list[tuple[str, bytes]] = []
    topics = Topics("r")
    downlinks = DownlinkModels("fp16", deltas=True)
    bases: dict[str, np.ndarray] = {}

    def manager(rnd: int, weights: np.ndarray) -> GroupManager:
        return GroupManager(
            GroupPlan(0, ("dev1", "dev2", "dev3"), "parallel", "m"),
            rnd,
            weights,
            TrainConfig(),
            topics=topics,
            publish=lambda topic, data, retain: sent.append((topic, data)),
            handoff="relay",
            deadline_s=60.0,
            seed=0,
            max_chunk=1 << 20,
            task_prefix="t",
            shared=SharedModels(topics, lambda topic, data, retain: sent.append((topic, data)), 1 << 20, "e"),
            codec="int8",
            bases=bases,
            downlinks=downlinks,
        )

    first = manager(1, _model(0))
    first.start(0.0)
    assert not [t for t, _ in sent if t == topics.frames("dev1")]  # round 1: the shared broadcast only
    first.on_result("dev1", TrainResult(first.members[0].task_id, 10, 0.5, 1, 0, 0, ()), 1.0)  # only dev1 answers
    sent.clear()
    second = manager(2, _model(1))
    second.start(2.0)
    (frame,) = [data for t, data in sent if t == topics.frames("dev1")]
    header = parse_frame(frame)[0]
    assert header.codec in DELTA_CODECS and header.base is not None  # a delta against what dev1 holds
    assert bases[header.sha256] is second.start_weights  # dev1's output decodes against the float32 original
    bodies = [decode_message(data).body for t, data in sent if t in (topics.inbox("dev1"), topics.inbox("dev2"))]
    requests = [b for b in bodies if isinstance(b, TrainRequest)]
    assert [r.shared for r in requests] == [(), (second.shared_key,)]  # dev2 is not known: the broadcast
    assert not any(r.discard_start for r in requests)  # an int8 run: the next start model may be a delta


def test_devices_that_hold_the_same_model_get_one_encoding_of_the_next() -> None:
    server, a, b = DownlinkModels("fp16", deltas=True), WaitingTasks(), WaitingTasks()
    first = server.encode("dev1", _model(0))
    assert server.encode("dev2", _model(0)) is first  # the same full model: encoded once
    for device, waiting, task in (("dev1", a, "t1"), ("dev2", b, "t2")):
        server.sent(device, task, first.key)
        _deliver(waiting, first, task)
        server.confirm(device, task)
    target = _model(0) + 0.01 * _model(1)

    one, two = server.encode("dev1", target), server.encode("dev2", target.copy())

    assert two is one and one.base == first.key  # both hold first's model: one delta for both
    changed = target.copy()
    changed[0] += 1.0
    assert server.encode("dev1", changed) is not one  # a different model is encoded anew


def test_a_member_s_model_may_come_only_from_the_server_or_its_direct_predecessor() -> None:
    from device.protocol import Topics
    from server.coordinator.manager import GroupManager
    from server.strategies.base import GroupPlan, TrainConfig

    def manager(mode: str, handoff: str) -> GroupManager:
        return GroupManager(
            GroupPlan(0, ("dev1", "dev2", "dev3"), mode, "m"),  # type: ignore[arg-type]
            1,
            _model(0),
            TrainConfig(),
            topics=Topics("r"),
            publish=lambda topic, data, retain: None,
            handoff=handoff,  # type: ignore[arg-type]
            deadline_s=60.0,
            seed=0,
            max_chunk=1 << 20,
            task_prefix="t",
        )

    chain = manager("chain", "direct")
    second = chain.members[1]
    assert chain.model_sources("dev2", second.task_id) == {SERVER_ID, "dev1"}
    assert chain.model_sources("dev1", chain.members[0].task_id) == {SERVER_ID}  # the head: the server
    assert chain.model_sources("dev2", "another task") == frozenset()  # not this group's task
    relayed = manager("chain", "relay")
    assert relayed.model_sources("dev2", relayed.members[1].task_id) == {SERVER_ID}  # the server relays
    parallel = manager("parallel", "relay")
    assert parallel.model_sources("dev3", parallel.members[2].task_id) == {SERVER_ID}
