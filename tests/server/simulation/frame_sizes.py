"""The bytes of the frames a payload would take, computed without building them: what
the tests' hand-driven boards count, to compare with what the simulator's bus counts
from the frames it carries (``server/simulation/virtual_bus.py``). Ids in the header
are placeholders of typical length, so a count may differ from a real frame's by a few
bytes (:func:`~device.protocol.frames.frames_size` builds the same headers but neither
hashes nor copies the payload)."""

from __future__ import annotations

import functools

import numpy as np

from device.protocol import DELTA_CODECS, FrameCodec, FrameExtra
from device.protocol.frames import frames_size

_BASE = "0" * 64  # a base's sha256 is 64 hex digits whatever it is


def frame_bytes(payload: np.ndarray, codec: FrameCodec) -> int:
    """Bytes of the frames that carry ``payload`` encoded by ``codec``."""
    return _frames_size(payload.shape, payload.dtype.str, codec)


@functools.lru_cache(maxsize=256)
def _frames_size(shape: tuple[int, ...], dtype: str, codec: FrameCodec) -> int:
    """The size depends on the payload's shape, dtype and codec alone (its headers hold
    no hash here), so it is built once per kind of payload, not two headers for each of
    a round's models."""
    return frames_size(
        np.empty(shape, np.dtype(dtype)),
        kind="result",
        run="sim",
        round=1,
        group=0,
        sender="sim-device",
        extra=FrameExtra("sim-task-r1-g0-p0", position=0),
        codec=codec,
        base=_BASE if codec in DELTA_CODECS else None,
    )
