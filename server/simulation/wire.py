"""Bytes on the wire in simulation: the frames a board would send, built and measured.

The simulator encodes every model it moves with the run's codec
(``device/protocol/codecs.py``) and counts the bytes of the frames
:func:`~device.protocol.encode_frames` would produce for it (header and chunking
included; :func:`~device.protocol.frames.frames_size` builds the same headers but
neither hashes nor copies the payload: hashing every model moved was a fifth of a
simulated FedAvg round). Ids in the header are placeholders of typical length, so
a count may differ from a board's by a few bytes per frame.
"""

from __future__ import annotations

import numpy as np

from device.protocol import DELTA_CODECS, FrameCodec, FrameExtra
from device.protocol.frames import frames_size

_BASE = "0" * 64  # a base's sha256 is 64 hex digits whatever it is


def frame_bytes(payload: np.ndarray, codec: FrameCodec) -> int:
    """Bytes of the frames that carry ``payload`` encoded by ``codec``."""
    return frames_size(
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
