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
    Topics,
    TrainRequest,
    encode_float,
    encode_frames,
    parse_frame,
    payload_key,
)
from device.waiting import WaitingTasks
from server.downlink import Downlink, DownlinkModels
from server.execution.chain import ChainManager
from server.execution.manager import GroupManager, ParallelManager
from server.execution.shared import SharedModels
from server.strategies.base import GroupPlan, TrainConfig

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


@pytest.mark.parametrize("bits", [8, 4])
def test_a_device_that_answered_gets_the_next_model_as_a_delta_and_decodes_what_the_server_expects(bits: int) -> None:
    server, device = DownlinkModels("fp16", deltas=True, bits=bits), WaitingTasks()  # type: ignore[arg-type]
    first = server.encode("dev1", _model(0))
    assert first.codec == "fp16" and first.base is None  # nothing held yet: the full model
    server.sent("dev1", "t1", first.key)
    assert np.array_equal(_deliver(device, first, "t1"), first.received)
    server.confirm("dev1", "t1")
    target = _model(0) + 0.01 * _model(1)  # the next round's model
    second = server.encode("dev1", target)
    assert second.codec in DELTA_CODECS and second.codec.startswith(f"int{bits}") and second.base == first.key
    assert second.payload.nbytes < first.payload.nbytes / (1.9 if bits == 8 else 3.8)  # fp16: 2 bytes a value
    got = _deliver(device, second, "t2")
    assert np.array_equal(got, second.received)  # bit for bit what the server will delta against next
    steps = (1 << bits) - 1  # a block's range over 255 (int8) or 15 (int4) steps; half a step at most
    assert np.abs(got - target).max() <= np.abs(target - first.received).max() / steps * 1.001  # + float rounding
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

    sent: list[tuple[str, bytes]] = []
    topics = Topics("r")
    downlinks = DownlinkModels("fp16", deltas=True)
    bases: dict[str, np.ndarray] = {}

    def manager(rnd: int, weights: np.ndarray) -> GroupManager:
        return _int8_manager(_PARALLEL, rnd, weights, topics, sent, bases, downlinks)

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
    assert bases[header.sha256] is second.sender.start_weights  # dev1's output decodes against the float32 original
    bodies = [decode_message(data).body for t, data in sent if t in (topics.inbox("dev1"), topics.inbox("dev2"))]
    requests = [b for b in bodies if isinstance(b, TrainRequest)]
    assert [r.shared for r in requests] == [(), (second.sender.shared_key,)]  # dev2 is not known: the broadcast
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
    from server.strategies.base import GroupPlan, TrainConfig

    def manager(mode: str, handoff: str) -> GroupManager:
        return (ChainManager if mode == "chain" else ParallelManager)(
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


def test_a_resent_hand_off_is_the_payload_first_sent_so_the_server_knows_what_the_member_holds() -> None:
    """After a reconnect the manager sends the member whose turn it is its model again.
    Encoded anew it would be a full model under another key (the first send made the
    server forget what the member held), which the member, already training on the
    first, refuses; the server would then record the wrong key and send the next round's
    delta against a model the member does not hold."""
    from device.protocol import Topics, TrainResult, parse_frame
    from server.strategies.base import GroupPlan

    # Prepare: an int8 relayed chain of two; dev2 held a model the server knows
    sent: list[tuple[str, bytes]] = []
    topics = Topics("r")
    downlinks = DownlinkModels("fp16", deltas=True)
    held = downlinks.encode("dev2", _model(9))
    downlinks.sent("dev2", "old", held.key)
    downlinks.confirm("dev2", "old")
    chain = _int8_manager(
        GroupPlan(0, ("dev1", "dev2"), "chain", "m"), 1, _model(0), topics, sent, {}, downlinks, False
    )
    chain.start(0.0)
    first_member = chain.members[0]
    chain.on_result("dev1", TrainResult(first_member.task_id, 10, 0.5, 1, 0, 0, ()), 1.0)
    hand_off = _model(1)
    (frame,) = encode_frames(
        hand_off,
        kind="result",
        run="r",
        round=1,
        group=0,
        sender="dev1",
        extra=FrameExtra(first_member.task_id, position=0),
    )
    payload = Reassembler().add(frame)
    assert payload is not None
    assert chain.on_frame(payload, hand_off, 2.0)  # relayed on to dev2
    first = [parse_frame(d)[0] for t, d in sent if t == topics.frames("dev2")]

    # Execute: the connection came back; the manager resends what is outstanding
    chain.resend_outstanding(3.0)

    # Assert: the same delta again, and the key the server records is that payload's
    frames = [parse_frame(d)[0] for t, d in sent if t == topics.frames("dev2")]
    assert len(first) == 1 and len(frames) == 2
    assert frames[1].codec in DELTA_CODECS and frames[1].base == held.key
    assert frames[1].sha256 == frames[0].sha256
    chain.on_result("dev2", TrainResult(chain.members[1].task_id, 10, 0.5, 1, 0, 1, ()), 4.0)
    assert downlinks.base_of("dev2") == frames[0].sha256


def test_relayed_int8_hand_offs_carry_each_member_s_upload_error_once_and_no_downlink_error() -> None:
    """A relayed int8 chain (server/execution/chain.py): each member decodes its start
    model from a downlink delta (its own error), trains, and uploads a delta against what
    it decoded; the manager adds that delta to the float32 model it sent. With training
    modelled as a fixed step, the chain's model after k members is within the sum of the
    k uploads' int8 bounds of the float32 chain: the downlink errors cancel exactly."""
    from device.protocol.codecs import ErrorFeedback, decode, pack
    from tests.device.test_codecs import _int8_bound

    # Prepare: ten members, each holding a different older model the server knows
    rng = np.random.default_rng(4)
    server = DownlinkModels("fp16", deltas=True)
    members = [f"dev{i}" for i in range(10)]
    for i, device in enumerate(members):
        held = server.encode(device, _model(100 + i))
        server.sent(device, "old", held.key)
        server.confirm(device, "old")
    exact = _model(0)  # the float32 chain
    current = exact.copy()  # the relayed int8 chain, as the manager holds it
    allowed = np.zeros_like(exact)

    for k, device in enumerate(members):
        # Execute: one hand-off
        down = server.encode(device, current)
        assert down.base is not None  # a delta against the member's own older model
        step = rng.normal(0, 0.01, N).astype(np.float32)  # the member's training
        trained = down.received + step  # it trains from what it decoded
        residual = ErrorFeedback()
        upload, codec = pack(residual.encode(trained, down.received), bits=8)
        current = decode(upload, codec, current)  # added to the float32 model sent
        exact = exact + step
        delta = trained - down.received
        allowed += _int8_bound(delta)

        # Assert: the downlink error is gone; only the upload's bound accumulates
        assert np.all(np.abs(current - exact) <= allowed + 1e-5), f"hand-off {k + 1}"
    assert np.abs(down.received - current).max() > 0  # members did train from perturbed models


def test_over_its_limit_the_cache_drops_models_no_device_holds_before_one_a_device_holds() -> None:
    """With a fixed 64 models FedGSP's relayed chain members evicted one another's held
    models every round (each holds its own), so most start models went in full."""
    # Prepare: dev1 holds the oldest model; room for two
    server = DownlinkModels("fp16", deltas=True, capacity=2)
    held = server.encode("dev1", _model(0))
    server.sent("dev1", "t1", held.key)
    server.confirm("dev1", "t1")

    # Execute: two newer models nobody holds (encoded, never sent)
    server.encode("dev2", _model(1))
    server.encode("dev2", _model(2))

    # Assert: dev1's model stayed; the next start model to dev1 is still a delta
    assert server.base_of("dev1") == held.key
    assert server.encode("dev1", _model(3)).base == held.key


def test_by_default_the_cache_keeps_as_many_models_as_its_memory_budget_holds() -> None:
    server = DownlinkModels("fp16", deltas=True, budget_bytes=3 * _model(0).nbytes)
    for i in range(5):  # five devices, each holding its own model
        down = server.encode(f"dev{i}", _model(i))
        server.sent(f"dev{i}", "t", down.key)
        server.confirm(f"dev{i}", "t")
    assert [server.base_of(f"dev{i}") is not None for i in range(5)] == [False, False, True, True, True]


@pytest.mark.parametrize("capacity", [2, None])
def test_encoding_a_group_s_devices_at_once_sends_what_encoding_them_one_by_one_sends(capacity: int | None) -> None:
    """``encode_all`` compares the model once for a group, and is otherwise ``encode``
    per device: the same payloads, bases and keys, and, with a cache too small for
    every held model, the same evictions (each device is recorded as sent before the
    next is encoded)."""

    def history(server: DownlinkModels) -> None:  # dev0..dev3 hold three different models
        for i in range(4):
            down = server.encode(f"dev{i}", _model(i % 3))
            server.sent(f"dev{i}", "t0", down.key)
            server.confirm(f"dev{i}", "t0")

    one, many = (DownlinkModels("fp16", deltas=True, capacity=capacity) for _ in range(2))
    history(one)
    history(many)
    devices = ["dev3", "dev0", "dev1", "new", "dev2"]
    target = _model(0) + 0.01 * _model(7)

    singly = []
    for d in devices:
        down = one.encode(d, target)
        one.sent(d, "t1", down.key)
        singly.append(down)
    together = []
    for d, down in zip(devices, many.encode_all(devices, target), strict=True):
        many.sent(d, "t1", down.key)
        together.append(down)

    assert [(a.payload.tobytes(), a.codec, a.base, a.key) for a in singly] == [
        (b.payload.tobytes(), b.codec, b.base, b.key) for b in together
    ]
    assert any(a.base is not None for a in singly) and any(a.base is None for a in singly)  # deltas and full
    assert list(one._models) == list(many._models)  # the same models kept, in the same order


def test_a_model_encoded_while_a_group_s_model_goes_out_does_not_take_its_place() -> None:
    """``encode_all`` (and ``unchanged``) skip the comparison with the last model; when
    another model is encoded in between, the group's next device still gets the
    group's model, not the other one."""
    server = DownlinkModels("fp16", deltas=False)
    group, other = _model(1), _model(2)
    devices = server.encode_all(["a", "b"], group)

    first = next(devices)
    intruder = server.encode("x", other)
    second = next(devices)

    assert np.array_equal(first.received, group.astype(np.float16).astype(np.float32))
    assert np.array_equal(intruder.received, other.astype(np.float16).astype(np.float32))
    assert second.key == first.key and np.array_equal(second.received, first.received)
    with server.unchanged(group):
        assert server.encode("c", group).key == first.key
        assert server.encode("y", other).key == intruder.key
        assert server.encode("d", group).key == first.key


def test_a_first_model_goes_as_q8_to_a_device_that_lists_it_and_as_fp16_to_one_that_does_not() -> None:
    """In int8 and int4 runs a device that holds nothing the server knows gets the whole
    model in 8-bit blocks if it decodes ``q8``; its next start model is a delta against
    the model it decoded, so the quantisation error does not stay."""
    listed = {"new": ("raw", "fp16", "int8", "int8z", "q8"), "old": ("raw", "fp16", "int8", "int8z")}
    server = DownlinkModels("fp16", deltas=True, first="q8", decodes=lambda d, c: c in listed[d])
    start, waiting = _model(0), WaitingTasks()

    new, old = server.encode("new", start), server.encode("old", start)

    assert (new.codec, old.codec) == ("q8", "fp16") and new.base is None
    assert new.payload.nbytes < 0.52 * old.payload.nbytes
    held = _deliver(waiting, new, "t1")  # what the device decodes is what the server expects it holds
    half_step = (start.max() - start.min()) / 255 / 2 * 1.0001  # no block spans more than the model
    assert np.array_equal(held, new.received) and 0 < np.abs(held - start).max() <= half_step
    server.sent("new", "t1", new.key)
    server.confirm("new", "t1")
    target = start + 0.01 * _model(1)
    nxt = server.encode("new", target)
    assert nxt.codec in DELTA_CODECS and nxt.base == new.key
    assert np.abs(nxt.received - target).max() < np.abs(new.received - start).max() / 10  # corrected


@pytest.mark.parametrize(
    ("old", "want"), [((), "q8"), (("dev3",), "q8"), (("dev2", "dev3"), "fp16")], ids=["none", "one", "most"]
)
def test_a_group_s_broadcast_goes_in_the_codec_most_members_decode_and_the_others_get_their_own_frame(
    old: tuple[str, ...], want: str
) -> None:
    """The shared start model of a parallel group is one payload: ``q8`` when most of
    the members without a delta list ``q8`` (agents from before it, in ``old``, do
    not), else ``fp16``. A member that does not decode the broadcast's codec gets its
    own frame in the codec it decodes. The server records each member as holding
    exactly the payload it was sent, and the members' uploads decode against the
    float32 start model."""
    sent: list[tuple[str, bytes]] = []
    topics = Topics("r")
    listed = {d: ("raw", "fp16", "int8", "int8z") if d in old else ("fp16", "q8") for d in ("dev1", "dev2", "dev3")}
    downlinks = DownlinkModels("fp16", deltas=True, first="q8", decodes=lambda d, c: c in listed[d])
    bases: dict[str, np.ndarray] = {}
    start = _model(0)
    manager = _int8_manager(_PARALLEL, 1, start, topics, sent, bases, downlinks)

    manager.start(0.0)

    assert manager.sender.shared_key is not None
    (frame,) = [data for t, data in sent if t == topics.shared_chunk(manager.sender.shared_key, 0)]
    header = parse_frame(frame)[0]
    own = {t.split("/")[-2]: parse_frame(data)[0] for t, data in sent if t.endswith("/frames")}
    assert header.codec == want
    assert {d: h.codec for d, h in own.items()} == {
        d: "fp16" if d in old else "q8" for d in listed if ("fp16" if d in old else "q8") != want
    }
    for d in listed:
        assert downlinks._sent[d][1] == (own[d].sha256 if d in own else header.sha256)
    assert all(bases[h.sha256] is start for h in [header, *own.values()])


_PARALLEL = GroupPlan(0, ("dev1", "dev2", "dev3"), "parallel", "m")


def _int8_manager(
    plan: GroupPlan,
    rnd: int,
    weights: np.ndarray,
    topics: Topics,
    sent: list[tuple[str, bytes]],
    bases: dict[str, np.ndarray],
    downlinks: DownlinkModels,
    broadcast: bool = True,
) -> GroupManager:
    """The manager of ``plan`` in an int8 run, publishing into ``sent`` (with shared
    broadcasts unless ``broadcast`` is false)."""
    shared = SharedModels(topics, lambda topic, data, retain: sent.append((topic, data)), 1 << 20, "e")
    return (ChainManager if plan.mode == "chain" else ParallelManager)(
        plan,
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
        shared=shared if broadcast else None,
        codec="int8",
        bases=bases,
        downlinks=downlinks,
    )


def test_a_model_encoded_for_a_broadcast_is_whole_even_for_a_device_that_holds_a_base() -> None:
    """``encode(..., full=codec)`` is what a shared broadcast carries: the whole model in
    that codec, and the key recorded for the device is the broadcast's, even when the
    device holds a model a delta could be against (a reviewer found a zero delta's key
    recorded for a broadcast member whose evicted base had come back)."""
    server = DownlinkModels("fp16", deltas=True, first="q8")
    held = server.encode("dev1", _model(0))
    server.sent("dev1", "t1", held.key)
    server.confirm("dev1", "t1")
    assert server.base_of("dev1") == held.key

    whole = server.encode("dev1", _model(0), "q8")

    assert (whole.codec, whole.base) == ("q8", None)
    assert whole.key == payload_key(encode_float(_model(0), "q8"))
