"""The simulator's byte count is the length of the frames a board would send
(``tests/server/simulation/frame_sizes.py``), computed without building them."""

from __future__ import annotations

import numpy as np
import pytest

from device.protocol import FrameExtra, encode_frames
from device.protocol.codecs import ErrorFeedback, encode_float, pack
from device.protocol.frames import frames_size
from tests.server.simulation.frame_sizes import frame_bytes


@pytest.mark.parametrize("n", [1, 1_000, 700_001])  # one frame, one frame, several chunks
@pytest.mark.parametrize("codec", ["raw", "fp16", "int8", "int4"])
def test_the_counted_size_is_the_length_of_the_frames_built(n: int, codec: str) -> None:
    # Prepare: a payload as the codec encodes it
    rng = np.random.default_rng(n)
    weights = rng.normal(0, 0.1, n).astype(np.float32)
    if codec in ("int8", "int4"):
        bits = 8 if codec == "int8" else 4
        payload, used = pack(ErrorFeedback().encode(weights, np.zeros_like(weights), bits), bits=bits)
    else:
        payload, used = encode_float(weights, codec), codec  # type: ignore[arg-type]
    kwargs = dict(
        kind="result",
        run="sim",
        round=12,
        group=3,
        sender="dev007",
        max_chunk=1 << 20,
        extra=FrameExtra("task-r12-g3-p1", position=1),
        codec=used,
        base="a" * 64 if used.startswith("int") else None,
    )

    # Execute
    built = sum(len(f) for f in encode_frames(payload, **kwargs))  # type: ignore[arg-type]
    counted = frames_size(payload, **kwargs)  # type: ignore[arg-type]

    # Assert
    assert counted == built
    assert frame_bytes(payload, used) >= payload.nbytes  # the simulator's count, headers included


def test_the_count_is_kept_per_kind_of_payload_and_equals_the_frames_built() -> None:
    """frame_bytes builds the headers once per shape, dtype and codec: payloads that
    differ in values only get the same count, which is that of the frames built, and
    another shape or codec gets its own."""
    from device.protocol import DELTA_CODECS
    from tests.server.simulation.frame_sizes import _frames_size

    def built(payload: np.ndarray, codec: str) -> int:
        frames = encode_frames(
            payload,
            kind="result",
            run="sim",
            round=1,
            group=0,
            sender="sim-device",
            extra=FrameExtra("sim-task-r1-g0-p0", position=0),
            codec=codec,  # type: ignore[arg-type]
            base="0" * 64 if codec in DELTA_CODECS else None,
        )
        return sum(len(f) for f in frames)

    rng = np.random.default_rng(4)
    first, second = rng.normal(size=1_500_000).astype(np.float32), rng.normal(size=1_500_000).astype(np.float32)
    shorter = first[:1_000].copy()
    codes = rng.integers(0, 256, 5_000).astype(np.uint8)

    hits = _frames_size.cache_info().hits
    counts = [frame_bytes(first, "raw"), frame_bytes(second, "raw"), frame_bytes(shorter, "raw")]

    assert _frames_size.cache_info().hits >= hits + 1  # the second payload of the same kind: no headers built
    assert counts == [built(first, "raw"), built(second, "raw"), built(shorter, "raw")]
    assert counts[0] == counts[1] > counts[2]
    assert frame_bytes(codes, "int8") == built(codes, "int8") != frame_bytes(codes, "int8z")
