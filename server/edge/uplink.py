"""How an edge sends a group's model up: in the run's codec (issue 28, Build 2).

The coordinator sends an edge the start model whole (float32), so both hold the same
start. The edge sends the group's one model up as the run's devices would send theirs:

* ``fp32``: the model (``raw``);
* ``fp16``: the model in float16;
* ``int8`` / ``int4``: the delta against the start model (``base`` = the start model's
  key, :data:`~server.edge.messages.EdgeTask.model`), quantised with the edge's error
  feedback for that group (Seide et al. 2014; Karimireddy et al. 2019, Alg. 2:
  ``device/protocol/codecs.py``), deflated when that is smaller.

The edge decodes what it sends with the receiver's code (:func:`decode`), so it knows
the model the coordinator will hold to the bit: it names that model in its report,
keeps it as the start of the group's next round, and sends that, ``raw``, to a
coordinator that asks again (after a restart the error feedback's residual is lost, as
a device's is).

Within the room the edge's managers use ``fp32`` whatever the run's codec: the room's
link is the short one, and each member's output is averaged at full precision. So in an
``int8`` run a group run at an edge is quantised once (its mean's delta) where centrally
each member's upload is; the simulator models the central path (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from device.errors import ProtocolError
from device.protocol import FrameCodec, WireCodec
from device.protocol.codecs import ErrorFeedback, decode, delta_bits, encode_float, pack, upload_codec


@dataclass(frozen=True)
class Upload:
    """A group model as it goes up: the payload, its codec, the base a delta names, and
    the float32 model the coordinator decodes from it."""

    payload: np.ndarray
    codec: FrameCodec
    base: str | None
    received: np.ndarray


def encode_upload(
    model: np.ndarray, start: np.ndarray, start_key: str, codec: WireCodec, feedback: ErrorFeedback
) -> Upload:
    """``model`` (a group's, trained from ``start``) as it goes up in a run with
    ``codec``; ``start_key`` names ``start`` (its float32 bytes' sha256).

    Parameters
    ----------
    model, start : float32 vectors of the model's length.
    start_key : the key the coordinator holds ``start`` under (the delta's base).
    codec : the run's wire codec.
    feedback : the edge's error feedback for this group (int8 and int4 only).

    Returns
    -------
    Upload
        Whatever the codec cannot carry goes ``raw``: non-finite weights (for the
        coordinator to refuse, naming the reason), weights beyond float16's range, and
        deltas too large to quantise (a group's model is its members' together, so
        nothing one member sent is lost to another's codec error).
    """
    frame = upload_codec(codec)
    weights = np.asarray(model, np.float32)
    finite = bool(np.isfinite(weights).all())
    if frame in ("int8", "int4") and finite:
        base = np.asarray(start, np.float32)
        trial = ErrorFeedback()
        trial.residual = feedback.residual
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                payload, packed = pack(trial.encode(weights, base, delta_bits(frame)), bits=delta_bits(frame))
                received = decode(payload, packed, base)
        except (ValueError, ProtocolError):  # a delta beyond what blocks of float32 scales hold
            pass
        else:
            feedback.residual = trial.residual
            return Upload(payload, packed, start_key, received)
    if frame == "fp16" and finite:
        payload = encode_float(weights, "fp16")
        if np.isfinite(payload).all():
            return Upload(payload, "fp16", None, decode(payload, "fp16"))
    return Upload(weights, "raw", None, weights)
