"""Bytes on the wire in simulation: the frames a board would send, built and measured.

The simulator encodes every model it moves with the run's codec
(``device/protocol/codecs.py``) and counts the bytes of the frames
:func:`~device.protocol.encode_frames` produces for it (header and chunking
included), not a formula. Ids in the header are placeholders of typical length, so
a count may differ from a board's by a few bytes per frame.
"""

from __future__ import annotations

import numpy as np

from device.protocol import DELTA_CODECS, FrameCodec, FrameExtra, encode_frames

_BASE = "0" * 64  # a base's sha256 is 64 hex digits whatever it is


def frame_bytes(payload: np.ndarray, codec: FrameCodec) -> int:
    """Bytes of the frames that carry ``payload`` encoded by ``codec``."""
    frames = encode_frames(
        payload,
        kind="result",
        run="sim",
        round=1,
        group=0,
        sender="sim-device",
        extra=FrameExtra("sim-task-r1-g0-p0", position=0),
        codec=codec,
        base=_BASE if codec in DELTA_CODECS else None,
    )
    return sum(len(f) for f in frames)
