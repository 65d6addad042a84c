"""A model passed whole to an in-process bus (device.protocol.whole_payload, a Carrier
publish): the payload its frames would deliver, by reference, and their size."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from device.protocol import FrameExtra, Payload, Reassembler, encode_frames, send_model, whole_payload

HEADER = {
    "kind": "result",
    "run": "r1",
    "round": 3,
    "group": 1,
    "sender": "dev007",
    "extra": FrameExtra("t-r3-g1-p0", position=0),
}


class _Carrier:
    """A publish that takes fp32 payloads whole."""

    carries = frozenset({"raw"})

    def __init__(self, hashes: bool) -> None:
        self.hashes = hashes
        self.frames: list[bytes] = []
        self.whole: list[tuple[str, Payload, int]] = []

    def __call__(self, topic: str, data: bytes, retain: bool) -> None:
        self.frames.append(data)

    def carry(self, topic: str, payload: Payload, size: int, retain: bool) -> None:
        self.whole.append((topic, payload, size))


@pytest.mark.parametrize("size", [1000, 600_000])  # one frame, and several
def test_a_whole_payload_is_what_its_frames_deliver_as_a_read_only_view_of_the_array(size: int) -> None:
    array = np.random.default_rng(0).standard_normal(size).astype(np.float32)

    whole, nbytes = whole_payload(array, **HEADER, max_chunk=900_000)  # type: ignore[arg-type]
    frames = list(encode_frames(array, **HEADER, max_chunk=900_000))  # type: ignore[arg-type]
    reassembler = Reassembler()
    framed = next(p for p in (reassembler.add(f, sender="dev007") for f in frames) if p is not None)

    assert nbytes == sum(len(f) for f in frames)  # msg ids differ, their length does not
    assert whole.header.sha256 == framed.header.sha256 == hashlib.sha256(array.tobytes()).hexdigest()
    assert whole.header.n_chunks == framed.header.n_chunks
    np.testing.assert_array_equal(whole.array, framed.array)
    assert np.shares_memory(whole.array, array) and not whole.array.flags.writeable
    with pytest.raises(ValueError):
        whole.array[0] = 1.0


@pytest.mark.parametrize("hashes", [True, False])
def test_send_model_hands_a_carrier_the_codecs_it_carries_whole_and_frames_the_rest(hashes: bool) -> None:
    array = np.arange(1000, dtype=np.float32)
    carrier = _Carrier(hashes)

    send_model(carrier, "t/raw", array, **HEADER)  # type: ignore[arg-type]
    send_model(carrier, "t/fp16", array.astype(np.float16), **HEADER, codec="fp16")  # type: ignore[arg-type]

    ((topic, payload, size),) = carrier.whole
    assert topic == "t/raw" and size > array.nbytes and np.shares_memory(payload.array, array)
    assert (payload.header.sha256 == hashlib.sha256(array.tobytes()).hexdigest()) is hashes
    assert len(payload.header.sha256) == 64
    assert len(carrier.frames) == 1  # fp16 is not carried: it went as its frame
