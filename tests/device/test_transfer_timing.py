"""Model transfers timed where they arrive: the spacing of a payload's chunks at the
receiver is the goodput of the path it crossed (device/protocol/frames.py,
``TransferTiming``); a device reports its start model's with the result it trains."""

from __future__ import annotations

import json

import numpy as np
import pytest

from device.errors import ProtocolError
from device.protocol import (
    SERVER_ID,
    EvaluateRequest,
    FrameExtra,
    InboundTransfer,
    Message,
    Reassembler,
    TrainRequest,
    TrainResult,
    decode_message,
    encode_frames,
)
from device.protocol.messages import DeviceHop, LocalTraining, ManagerHop
from device.waiting import WaitingTasks, inbound_of


def _frames(n: int, max_chunk: int, sender: str = SERVER_ID, task: str = "t1") -> list[bytes]:
    w = np.arange(n, dtype=np.float32)
    return list(
        encode_frames(
            w, kind="model", run="r", round=1, group=0, sender=sender, max_chunk=max_chunk, extra=FrameExtra(task)
        )
    )


def test_a_chunked_payload_is_timed_from_its_first_chunk_to_its_last() -> None:
    # Prepare: 40,000 bytes in 10,000-byte chunks, arriving 0.1 s apart (as a 800 kbit/s link spaces them)
    frames = _frames(10_000, 10_000)
    r = Reassembler()

    # Execute
    out = [r.add(f, received_at=100.0 + 0.1 * k) for k, f in enumerate(frames)]

    # Assert: the three chunks after the first, over the 0.3 s they took
    payload = out[-1]
    assert payload is not None and payload.timing is not None
    assert payload.timing.nbytes == 30_000 and payload.timing.seconds == pytest.approx(0.3)
    assert payload.timing.goodput_bps == pytest.approx(8 * 30_000 / 0.3)
    # joined into one writable buffer (a device may train into it), the chunks let go of
    assert payload.array.flags.writeable and r.held_bytes == 0
    np.testing.assert_array_equal(payload.array.view(np.float32), np.arange(10_000, dtype=np.float32))


def test_one_chunk_or_chunks_too_close_to_time_give_no_goodput() -> None:
    single = Reassembler().add(_frames(100, 10_000)[0], received_at=5.0)
    assert single is not None and single.timing is None  # nothing to space
    r = Reassembler()
    frames = _frames(10_000, 10_000)
    out = [r.add(f, received_at=5.0 + 1e-5 * k) for k, f in enumerate(frames)]  # 30 µs for 30 kB: noise
    assert out[-1] is not None and out[-1].timing is not None and out[-1].timing.goodput_bps is None
    assert inbound_of(out[-1]) is None


def test_a_train_task_carries_how_fast_its_model_arrived_and_the_result_reports_it() -> None:
    # Prepare: a chain member waits for its predecessor's hand-off
    request = TrainRequest("t1", 0, 1, "chain", "dev001", DeviceHop("dev003", "t2"), LocalTraining(1, 10, 0.1), 1)
    waiting = WaitingTasks()
    waiting.add(request, 1)
    r = Reassembler()
    frames = _frames(10_000, 10_000, sender="dev001")

    # Execute
    payload = [r.add(f, sender="dev001", received_at=float(k)) for k, f in enumerate(frames)][-1]
    assert payload is not None
    ready = waiting.accept(payload, 10_000)
    result = TrainResult("t1", 10, 0.5, 1, 0, 1, (10,), inbound=ready[0].inbound)
    back = decode_message(Message.of(result, run="r", sender="dev002").encode()).body

    # Assert: the path is the predecessor's, the figures the receiver's own
    assert ready[0].inbound == InboundTransfer("dev001", 30_000, 3.0)
    assert isinstance(back, TrainResult) and back.inbound == ready[0].inbound


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("seconds", 0, "must be above 0"),
        ("nbytes", 0, "must be at least 1"),
        ("seconds", 1e-12, "not between 0 and 1e12 bit/s"),
        ("source", "a/b", "transfer source"),
    ],
)
def test_garbage_transfer_figures_are_refused_with_the_reason(field: str, value: object, why: str) -> None:
    good = TrainResult("t1", 10, 0.5, 1, 0, 0, (10,), inbound=InboundTransfer(SERVER_ID, 1000, 0.01))
    raw = json.loads(Message.of(good, run="r", sender="dev002").encode())
    raw["body"]["inbound"][field] = value
    with pytest.raises(ProtocolError, match=why):
        decode_message(json.dumps(raw).encode())


def test_a_shared_model_that_serves_two_tasks_is_trained_into_by_neither() -> None:
    # Prepare: a train task and an evaluation wait for the same shared start model
    train = TrainRequest("t1", 0, 0, "parallel", SERVER_ID, ManagerHop(0), LocalTraining(1, 10, 0.1), 1, shared=("k1",))
    waiting = WaitingTasks()
    waiting.add(train, 1)
    waiting.add(EvaluateRequest("e1", 1, "test", shared=("k1",)), 1)
    frames = list(
        encode_frames(
            np.arange(100, dtype=np.float32),
            kind="model",
            run="r",
            round=1,
            group=0,
            sender=SERVER_ID,
            extra=FrameExtra(shared="k1"),
        )
    )

    # Execute
    ready = waiting.accept(Reassembler().add(frames[0]), 100)  # type: ignore[arg-type]

    # Assert: both got it; the training may not write into what the evaluation reads
    by_task = {r.request.task_id: r for r in ready}
    assert set(by_task) == {"t1", "e1"}
    assert np.shares_memory(by_task["t1"].weights, by_task["e1"].models[0]) and not by_task["t1"].exclusive
