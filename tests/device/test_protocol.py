"""Wire protocol: topics, messages, frames, chunking and every way a frame can be bad."""

from __future__ import annotations

import hashlib
import json
import logging
import struct

import numpy as np
import pytest

from device.errors import ProtocolError
from device.protocol import (
    MAGIC,
    FrameExtra,
    Message,
    Ping,
    ProtocolVersionError,
    Reassembler,
    Topics,
    check_weights,
    decode_message,
    encode_frames,
    parse_frame,
)


def _frames(array: np.ndarray, max_chunk: int = 1000, sender: str = "dev001") -> list[bytes]:
    return list(
        encode_frames(
            array,
            kind="model",
            run="r1",
            round=3,
            group=2,
            sender=sender,
            max_chunk=max_chunk,
            extra=FrameExtra("t1"),
        )
    )


def test_topics_are_rooted_per_run_name_the_sender_and_check_ids() -> None:
    t = Topics("r1")
    assert t.inbox("dev001") == "covey/r1/device/dev001/inbox"
    assert t.artifact_chunk(0) == "covey/r1/artifact/chunk/0"
    # everything a device publishes carries its id; the receiver reads it back from the topic
    assert t.results("dev001") == "covey/r1/from/dev001/results"
    assert t.device_of("covey/r1/from/dev001/frames") == ("dev001", "frames")
    assert t.device_of("covey/r1/from/dev001/../frames") is None
    assert t.device_of("covey/r2/from/dev001/frames") is None
    assert t.handoff("dev002", "dev001") == "covey/r1/device/dev002/frames/from/dev001"
    assert t.handoff_sender("covey/r1/device/dev002/frames/from/dev001", "dev002") == "dev001"
    assert t.handoff_sender("covey/r1/device/dev003/frames/from/dev001", "dev002") is None
    with pytest.raises(ProtocolError, match="run id"):
        Topics("a/b")
    with pytest.raises(ProtocolError, match="device id"):
        t.inbox("dev#1")


def test_messages_round_trip_and_bad_ones_are_named() -> None:
    msg = Message.of(Ping(12.5), run="r1", sender="server", round=4)
    back = decode_message(msg.encode())
    assert (back.type, back.round, back.body) == ("ping", 4, Ping(12.5))
    raw = json.loads(msg.encode())
    with pytest.raises(ProtocolError, match="not UTF-8 JSON"):
        decode_message(b"{nope")
    with pytest.raises(ProtocolVersionError, match="version") as info:
        decode_message(json.dumps({**raw, "v": 1}).encode())
    assert info.value.version == 1
    with pytest.raises(ProtocolError, match="unknown message type"):
        decode_message(json.dumps({**raw, "type": "hack"}).encode())
    with pytest.raises(ProtocolError, match=r"message\.round must be an integer"):
        decode_message(json.dumps({**raw, "round": "3"}).encode())
    with pytest.raises(ProtocolError, match=r"ping\.body\.t is missing"):
        decode_message(json.dumps({**raw, "body": {}}).encode())
    with pytest.raises(ProtocolError, match="binary frame"):
        decode_message(_frames(np.zeros(4, np.float32))[0])


def test_weights_survive_chunked_frames_exactly() -> None:
    w = np.random.default_rng(0).normal(size=10_000).astype(np.float32)
    frames = _frames(w, max_chunk=7_000)
    assert len(frames) == 6  # 40,000 bytes in 7,000-byte chunks
    r = Reassembler()
    out = [r.add(f) for f in reversed(frames)]  # any arrival order
    payload = next(p for p in out if p is not None)
    np.testing.assert_array_equal(payload.array, w)
    assert payload.header.sender == "dev001" and payload.header.round == 3
    assert check_weights(payload, 10_000).dtype == np.float32


def test_a_big_endian_array_travels_as_its_little_endian_values() -> None:
    """Frames are little-endian; a big-endian array is swapped on the way, not refused."""
    w = np.random.default_rng(1).normal(size=1_000).astype(">f4")

    frames = _frames(w, max_chunk=1_500)
    r = Reassembler()
    payload = next(p for p in (r.add(f) for f in frames) if p is not None)

    assert payload.header.dtype == "float32"
    np.testing.assert_array_equal(payload.array, w)
    assert payload.array.dtype.byteorder in ("<", "=")


def test_fifty_interleaved_chunked_payloads_all_reassemble() -> None:
    # a parallel round: every device uploads at once and the chunks interleave
    models = {f"dev{i:03d}": np.full(5_000, i, np.float32) for i in range(50)}
    streams = {d: _frames(w, max_chunk=3_000, sender=d) for d, w in models.items()}
    r = Reassembler()
    done = {}
    for chunk_index in range(len(next(iter(streams.values())))):
        for device, frames in streams.items():
            payload = r.add(frames[chunk_index])
            if payload is not None:
                done[payload.header.sender] = payload.array
    assert set(done) == set(models) and r.evicted == 0
    for device, w in models.items():
        np.testing.assert_array_equal(done[device], w)


def test_partial_payloads_beyond_the_byte_bound_evict_the_oldest() -> None:
    a, b = (_frames(np.full(1_000, v, np.float32), max_chunk=1_000) for v in (1, 2))
    r = Reassembler(max_pending_bytes=6_000)  # room for one 4,000-byte payload in flight
    assert r.add(a[0]) is None
    assert r.add(b[0]) is None  # does not fit beside a: a's partial copy goes
    assert r.evicted == 1 and r.pending_bytes == 4_000
    out = [r.add(f) for f in b[1:]]
    assert out[-1] is not None and float(out[-1].array[0]) == 2.0
    assert all(r.add(f) is None for f in a[1:])  # a lost its first chunk: never completes
    assert r.pending_bytes == 4_000  # bounded, and a later payload may evict it


def test_one_sender_cannot_crowd_out_the_others() -> None:
    # Prepare: room for 40 KB in all, at most 8 KB per sender; payloads of 4 KB in 4 chunks
    r = Reassembler(max_pending_bytes=40_000, max_pending_per_sender=8_000)
    honest = _frames(np.full(1_000, 7, np.float32), sender="honest")
    flood = [_frames(np.full(1_000, v, np.float32), sender="rogue") for v in range(50)]

    # Execute: the honest sender's first chunk, then 50 partial payloads from the rogue
    assert r.add(honest[0]) is None
    for frames in flood:
        assert r.add(frames[0]) is None
    done = [r.add(f) for f in honest[1:]]

    # Assert: the rogue evicted only its own partials; the honest payload completed
    assert r.evicted == 48
    assert done[-1] is not None and float(done[-1].array[0]) == 7.0
    assert r.pending_bytes == 8_000  # the rogue's two newest


def _rebuild(frame: bytes, **changes: object) -> bytes:
    (n,) = struct.unpack("<I", frame[4:8])
    header = json.loads(frame[8 : 8 + n])
    header.update(changes)
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + frame[8 + n :]


def test_bad_frames_are_refused_with_the_reason() -> None:
    w = np.arange(100, dtype=np.float32)
    (frame,) = _frames(w, max_chunk=10_000)
    with pytest.raises(ProtocolError, match="magic"):
        parse_frame(b"XXXX" + frame[4:])
    with pytest.raises(ProtocolError, match="truncated"):
        parse_frame(frame[:20])
    with pytest.raises(ProtocolError, match="truncated or padded"):
        Reassembler().add(frame[:-10])
    with pytest.raises(ProtocolError, match="truncated or padded"):
        Reassembler().add(frame + b"\0" * 100_000)
    with pytest.raises(ProtocolError, match="group must be an integer"):
        parse_frame(_rebuild(frame, group=None))
    with pytest.raises(ProtocolError, match="codec must be one of"):
        parse_frame(_rebuild(frame, codec="zstd"))
    with pytest.raises(ProtocolError, match=r"needs extra\.task_id"):
        parse_frame(_rebuild(frame, kind="update", extra={}))
    with pytest.raises(ProtocolError, match="exceeds"):
        parse_frame(frame, max_frame=100)
    with pytest.raises(ProtocolError, match="sha256"):
        Reassembler().add(frame[:-4] + b"\0\0\0\0")
    with pytest.raises(ProtocolError, match="dtype"):
        parse_frame(_rebuild(frame, dtype="float64"))
    with pytest.raises(ProtocolError, match="does not hold"):
        parse_frame(_rebuild(frame, shape=[99]))
    with pytest.raises(ProtocolError, match="kind must be one of"):
        parse_frame(_rebuild(frame, kind="pickle"))
    with pytest.raises(ProtocolError, match="exceeds"):
        Reassembler(max_bytes=100).add(frame)


def test_weights_with_the_wrong_length_dtype_or_nan_are_refused() -> None:
    r = Reassembler()
    good = r.add(_frames(np.zeros(10, np.float32))[0])
    assert good is not None
    with pytest.raises(ProtocolError, match="model has 11"):
        check_weights(good, 11)
    nan = np.zeros(10, np.float32)
    nan[3] = np.nan
    bad = r.add(_frames(nan)[0])
    assert bad is not None
    with pytest.raises(ProtocolError, match="NaN"):
        check_weights(bad, 10)
    raw = r.add(
        next(iter(encode_frames(np.zeros(10, np.uint8), kind="artifact", run="r", round=0, group=0, sender="server")))
    )
    assert raw is not None
    with pytest.raises(ProtocolError, match="float32"):
        check_weights(raw, 10)
    assert hashlib.sha256(np.zeros(10, np.float32).tobytes()).hexdigest() == good.header.sha256


def test_a_frame_whose_header_names_another_sender_than_its_topic_is_refused() -> None:
    (frame,) = _frames(np.zeros(10, np.float32), sender="dev001")
    with pytest.raises(ProtocolError, match="claims sender 'dev001' but came from 'dev002'"):
        Reassembler().add(frame, sender="dev002")
    assert Reassembler().add(frame, sender="dev001") is not None


def test_partials_never_hold_more_than_they_announce_and_expire(monkeypatch) -> None:
    # the attack: partial frames announcing 4 bytes but carrying 100 KB each
    small = _frames(np.zeros(1, np.float32))[0]
    r = Reassembler(max_pending_bytes=10_000, max_age_s=30.0)
    for _ in range(100):
        with pytest.raises(ProtocolError, match="truncated or padded"):
            r.add(small + b"\0" * 100_000)
    assert r.held_bytes == 0
    # chunks of an unfinished payload go away after max_age_s without a chunk
    chunks = _frames(np.zeros(2_000, np.float32), max_chunk=1_000)
    clock = [1000.0]
    monkeypatch.setattr("device.protocol.frames.time.monotonic", lambda: clock[0])
    assert r.add(chunks[0]) is None and r.held_bytes == 1_000
    clock[0] += 31.0
    assert r.add(_frames(np.ones(3, np.float32))[0]) is not None  # any later frame expires the old partial
    assert r.expired == 1 and r.held_bytes == 0


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"CVY2\x10\x00", "truncated before its header length"),  # issue 26: said "version 2, expected 2"
        (b"CVY", "bad magic"),
        (b"CVY1" + bytes(20), "protocol version 1, expected 2"),
        (b"XXXX" + bytes(20), "bad magic"),
    ],
)
def test_a_short_or_foreign_frame_is_named_for_what_it_is(frame: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        parse_frame(frame)


def test_a_flood_of_evictions_logs_a_few_lines_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: a sender may hold one partial payload of 8 bytes; 200 first chunks of others
    caplog.set_level(logging.WARNING, logger="covey.protocol")
    reassembler = Reassembler(max_pending_per_sender=8)
    firsts = [
        next(
            iter(
                encode_frames(
                    np.full(2, i, np.float32),
                    kind="result",
                    run="r",
                    round=1,
                    group=0,
                    sender="d1",
                    extra=FrameExtra("t", position=0),
                    max_chunk=4,
                )
            )
        )
        for i in range(200)
    ]

    # Execute
    for frame in firsts:
        assert reassembler.add(frame, sender="d1") is None

    # Assert: 199 evictions, counted; five lines logged, the rest held back
    assert reassembler.evicted == 199
    assert sum("evicted the partial" in r.getMessage() for r in caplog.records) == 5
    assert reassembler._log.held_back == 194
