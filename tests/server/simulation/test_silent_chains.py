"""A direct chain with silent members: the coordinator's group manager and the
simulator take the same steps and end with the same models.

The manager side is the real :class:`ChainManager` with its messages and frames
carried in process to boards that do what covey's agent does (train with the
simulator's own trainer, the code agents run; hand on in the downlink codec; resend
the held output as float32; hold the last model the server sent). Every pattern of
silent members in a chain of four, a poisoner among them, over two rounds (the
second's start models are deltas against what the first left on each board).
``tests/mqtt/test_equivalence.py`` checks two of the patterns with agent processes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest

from device.protocol import (
    DeviceHop,
    ErrorFeedback,
    FrameCodec,
    FrameExtra,
    ResendRequest,
    Topics,
    TrainRequest,
    TrainResult,
    WireCodec,
    decode_message,
    downlink_codec,
    encode_frames,
    encode_output,
    first_codec,
    wire_bits,
)
from device.protocol.codecs import decode
from device.protocol.frames import Reassembler
from server.downlink import DownlinkModels
from server.execution.chain import ChainManager
from server.simulation.datasets import synthetic
from server.simulation.engine import VirtualDevices
from server.simulation.faults import Faults
from server.simulation.trainer import Trainer
from server.strategies.base import GroupPlan, RoundPlan, TrainConfig
from tests.server.simulation.frame_sizes import frame_bytes

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.05)
SEED = 7
DEADLINE_S = 10.0


@dataclass
class Boards:
    """What each board holds between rounds: the last model the server sent it, by key."""

    trainer: Trainer
    silent: frozenset[str]
    held: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def _frame_to_manager(manager: ChainManager, device: str, task: str, payload: np.ndarray, codec: FrameCodec) -> None:
    (frame,) = encode_frames(
        payload,
        kind="result",
        run="r",
        round=manager.round,
        group=manager.plan.group_id,
        sender=device,
        extra=FrameExtra(task, position=0),
        codec=codec,
        max_chunk=1 << 30,
    )
    payload = Reassembler().add(frame)
    assert payload is not None
    assert manager.on_frame(payload, decode(payload.array, codec), 0.0)  # direct chains upload no deltas


def _board_round(
    boards: Boards, members: tuple[str, ...], rnd: int, start: np.ndarray, codec: WireCodec, downlinks
) -> tuple[np.ndarray, int, dict[str, int]]:  # type: ignore[no-untyped-def]
    """One round of a direct chain as the coordinator runs it: its model, the resends,
    and the bytes of the model frames: the boards sent (``up``), the manager sent to
    boards that answer (``down``), and boards received from their predecessors
    (``peer``)."""
    topics, outbox = Topics("r"), []
    manager = ChainManager(
        GroupPlan(0, members, "chain", "m"),
        rnd,
        start,
        TRAIN,
        topics=topics,
        publish=lambda topic, data, retain: outbox.append((topic, data)),
        handoff="direct",
        deadline_s=DEADLINE_S,
        seed=SEED,
        max_chunk=1 << 30,
        task_prefix="t",
        codec=codec,
        bases={},
        downlinks=downlinks,
    )
    requests: dict[str, TrainRequest] = {}
    arrived: dict[str, np.ndarray] = {}  # each board's start model, once it came
    outputs: dict[str, np.ndarray] = {}
    resends, now = 0, 0.0
    wire = {"up": 0, "down": 0, "peer": 0}
    manager.start(now)
    while not manager.done:
        progressed = bool(outbox)
        while outbox:
            topic, data = outbox.pop(0)
            device = next(d for d in members if topic in (topics.inbox(d), topics.frames(d)))
            if topic == topics.inbox(device):
                body = decode_message(data).body
                if isinstance(body, TrainRequest):
                    requests[device] = body
                elif isinstance(body, ResendRequest):
                    resends += 1
                    if device not in boards.silent:  # the held output, as float32
                        _frame_to_manager(manager, device, body.task_id, outputs[device], "raw")
                        wire["up"] += frame_bytes(outputs[device], "raw")
                continue
            payload = Reassembler().add(data)
            assert payload is not None
            h = payload.header
            base = None if h.base is None else boards.held[device][h.base]
            model = decode(payload.array, h.codec, base)
            boards.held[device] = {h.sha256: model}
            if device not in boards.silent:
                arrived[device] = model
                wire["down"] += frame_bytes(payload.array, h.codec)
        for device in members:
            if device in boards.silent or device in outputs or device not in arrived or device not in requests:
                continue
            request = requests[device]
            result = boards.trainer.train(arrived[device], device, request.train, request.seed, rnd).outcome
            assert result is not None
            outputs[device] = result.weights
            # in the codec the request names, as the agent does (device/tasks.py)
            payload, codec_used = encode_output(result.weights, arrived[device], request.codec, ErrorFeedback())
            wire["up"] += frame_bytes(payload, codec_used)
            if isinstance(request.next, DeviceHop):  # straight to the successor
                if request.next.device not in boards.silent:
                    arrived[request.next.device] = decode(payload, codec_used)
                    wire["peer"] += frame_bytes(payload, codec_used)
            else:
                _frame_to_manager(manager, device, request.task_id, payload, codec_used)
            manager.on_result(device, TrainResult(request.task_id, result.n_samples, result.loss, 1, 0, 0, ()), now)
            progressed = True
        if not progressed:  # everyone who answers is done: the next deadline passes
            now += DEADLINE_S + 1
            manager.tick(now)
    assert manager.final is not None
    return manager.final, resends, wire


def _silent_runs_after_an_answer(members: tuple[str, ...], silent: frozenset[str]) -> int:
    """Runs of silent members after a member that answered: the manager asks the last
    member that answered before each to send its output again, once."""
    runs, answered, in_run = 0, False, False
    for m in members:
        if m not in silent:
            answered, in_run = True, False
        elif answered and not in_run:
            runs, in_run = runs + 1, True
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_every_pattern_of_silent_members_gives_the_coordinators_models(zoo_model, codec: WireCodec) -> None:
    # Prepare: four devices, one of them a poisoner
    model = zoo_model("mclr_synthetic")
    fed = synthetic(1, 1, 4, seed=3)
    names = tuple(sorted(fed))
    poisoner = names[1]
    cases = 0
    for mask in itertools.product([False, True], repeat=len(names)):
        silent = frozenset(n for n, s in zip(names, mask, strict=True) if s)
        faults = Faults(unresponsive=silent, scale={poisoner: 5.0})
        sim = VirtualDevices(fed, model, faults=faults, codec=codec, handoff="direct")
        bits = wire_bits(codec)
        downlinks = (
            None
            if bits is None
            else DownlinkModels(downlink_codec(codec), deltas=True, bits=bits, first=first_codec(codec))
        )
        boards = Boards(sim.local, silent)
        start = sim.initial_weights()
        board_start, sim_start = start, start
        for rnd, members in ((1, names), (2, names[::-1])):
            # Execute: the same round both ways
            board_final, resends, board_bytes = _board_round(boards, members, rnd, board_start, codec, downlinks)
            plan = RoundPlan(rnd, (GroupPlan(0, members, "chain", "m"),), {"m": sim_start}, TRAIN)
            (result,) = sim.execute(plan, seed=SEED)
            assert result.final_weights is not None

            # Assert: the same model, the same bases held, one resend per run of silent members
            # (counted by the simulator as the boards saw them), and the simulator counts the
            # frames the boards and the manager sent, and the hand-offs the boards received
            where = f"{codec}, silent {sorted(silent)}, round {rnd}"
            np.testing.assert_array_equal(board_final, result.final_weights, err_msg=where)
            if downlinks is not None:
                assert {d: downlinks.base_of(d) for d in names} == {d: sim.downlinks.base_of(d) for d in names}, where
            assert resends == _silent_runs_after_an_answer(members, silent), where
            stats = sim.round_stats()
            assert stats.resends == resends, where  # what the round record reports as resends
            counted = stats.wire_bytes
            assert counted.keys() == board_bytes.keys(), where
            for kind, n in board_bytes.items():  # the sim's frame headers name real ids: a few bytes apart
                assert abs(counted[kind] - n) <= 0.02 * n + 16, (where, kind, counted, board_bytes)
            assert {m.client_id for m in result.members} == set(members) - silent, where
            board_start = board_final + np.float32(0.01)
            sim_start = result.final_weights + np.float32(0.01)
            cases += 1
        sim.close()
    assert cases == 2 * 2 ** len(names)
