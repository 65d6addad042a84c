"""Wire codecs for model payloads: float32, float16, and 8- or 4-bit deltas with error feedback.

A run picks one :data:`WireCodec` (``covey simulate --codec``, ``covey server run
--codec``, config key ``codec``); every model frame then names its
:data:`FrameCodec` in the header (``codec``), so a receiver always knows how to
decode it, and a delta frame (``int8``, ``int4``) also names its ``base``. The frame's ``sha256``
covers the *encoded* bytes, the bytes that were sent (``device/protocol/frames.py``).

Frame codecs and their error bounds (``x`` the float32 weights, ``x̂`` what the
receiver reconstructs):

* ``raw`` (run option ``fp32``; the header value of protocol 2 before codecs): the
  float32 bytes. Exact: ``x̂ == x``.
* ``fp16``: IEEE half precision of the weights (round to nearest even).
  ``|x̂ - x| <= 2**-11 * |x|`` for ``2**-14 <= |x| <= 65504``, and
  ``|x̂ - x| <= 2**-25`` below (the subnormal spacing is ``2**-24``). Weights beyond
  65504 become infinite, which the receiver refuses.
* ``int8``: a *delta* against a base model the receiver already holds, quantised
  affinely per block of :data:`BLOCK` values (Jacob et al., "Quantization and
  training of neural networks for efficient integer-arithmetic-only inference",
  CVPR 2018, Eq. 1, with one scale and offset per block): for block ``b``,
  ``lo = min d_b``, ``s = (max d_b - lo) / 255``, ``q = round((d - lo) / s)`` in
  0..255 and ``d̂ = lo + q * s``. ``|d̂ - d| <= s / 2 + 2**-22 * max|d_b|`` (half
  a step, plus float32 rounding). The payload is uint8: ``nb`` float32 scales,
  ``nb`` float32 offsets (little-endian), then the ``n`` codes, ``nb = ceil(n /
  256)``. The header's ``base`` is the sha256 of the frame payload in which the
  receiver got the base model (the start model of the round or group); a receiver
  that does not hold it refuses the frame (:class:`~device.errors.ProtocolError`).
  A chain's hand-off is the chain's current model as a delta against the group's
  start model: a member trains from the model it decoded, so each hop's error is
  carried on but never quantised again, and after ``k`` hand-offs the model is within
  the sum of the ``k`` hops' bounds of the float32 chain's (in practice near the
  square root of ``k`` times one hop's, the errors being independent).

* ``int8z``: an ``int8`` payload whose codes are deflated (zlib, RFC 1950/1951): the
  ``nb`` scales and offsets as in ``int8``, then one zlib stream of the ``n`` codes
  (``n`` is the base's length). Lossless over ``int8``, so the same bound. A sender
  uses it when it is smaller (:func:`pack`): a device's trained delta has long runs of
  equal codes (weights whose inputs never vary get no gradient), which deflate well; a
  downlink delta's codes hardly do (both measured in ``docs/results.md``, "Wire
  codecs"). The receiver inflates at most ``n`` bytes and refuses a stream that is
  corrupt, longer or shorter (a small frame can never inflate beyond the model).
* ``int4`` / ``int4z``: as ``int8`` / ``int8z`` with 16 levels: ``s = (max d_b - lo) /
  15``, ``q`` in 0..15, two codes per byte (the first in the low nibble; an odd count
  ends in a zero nibble, which the receiver checks), so ``nb`` scales and offsets,
  then ``ceil(n / 2)`` bytes of codes; ``int4z`` deflates those bytes, and the
  receiver inflates at most ``ceil(n / 2)``. ``|d̂ - d| <= s / 2 + 2**-22 * max|d_b|`` with that ``s`` (17 times int8's).
  Why a second width: a dense delta (every weight moves, as in the FEMNIST CNN)
  hardly deflates, so int8 is little more than its 4x fewer bytes than float32, and a
  relayed chain hand-off crosses the wire twice (member to manager, manager to
  successor) where an fp32 one crosses once: int8 FedGSP on the CNN stays well short of
  4x fewer bytes than fp32. int4 halves each delta's codes (not the full models a
  device gets the first time); both measured in ``docs/results.md``, "Wire codecs".
* ``q8``: a *whole model* in ``int8``'s layout (per block of :data:`BLOCK`, ``lo =
  min x_b``, ``s = (max x_b - lo) / 255``, the codes), without a base: ``|x̂ - x| <=
  s / 2 + 2**-22 * max|x_b|``. In ``int8`` and ``int4`` runs a device that holds no
  model the server knows (its first start model, a model sent but not answered, or
  after the server's cache let its model go) gets the whole model this way if it
  lists ``q8`` in its ``register``, and as ``fp16`` otherwise (:func:`first_codec`; a
  group's shared broadcast goes in the codec most of its members decode, the others
  getting their own frame). About
  1.03 bytes per weight against fp16's 2. The quantisation error does not reach the
  aggregate: the device's upload is a delta against the model it decoded, which the
  server adds to its float32 original, and its next start model is a delta against
  what it decoded. It only moves the point that device's training starts from.

Error feedback (Seide et al., "1-bit stochastic gradient descent", Interspeech 2014;
Karimireddy et al., "Error feedback fixes SignSGD", ICML 2019, Alg. 2): the sender
keeps the residual ``e`` of its last quantisation and adds it to the next delta,
``q_t = Q(d_t + e_{t-1})``, ``e_t = d_t + e_{t-1} - Q^-1(q_t)`` (:class:`ErrorFeedback`),
so what the receivers got sums to what was meant up to the last residual alone.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Literal

import numpy as np

from device.errors import ProtocolError

FrameCodec = Literal["raw", "fp16", "int8", "int8z", "int4", "int4z", "q8"]
FRAME_CODECS: tuple[str, ...] = ("raw", "fp16", "int8", "int8z", "int4", "int4z", "q8")
DELTA_CODECS: tuple[str, ...] = ("int8", "int8z", "int4", "int4z")  # payloads against a base the receiver holds
WireCodec = Literal["fp32", "fp16", "int8", "int4"]
WIRE_CODECS: tuple[str, ...] = ("fp32", "fp16", "int8", "int4")
DELTA_WIRE_CODECS: tuple[str, ...] = ("int8", "int4")  # runs whose models travel as deltas where they can
Bits = Literal[8, 4]
BLOCK = 256  # values per block: 8 bytes of scale and offset per 256 codes (256 bytes int8, 128 int4)
_BITS: dict[str, Bits] = {"int8": 8, "int8z": 8, "int4": 4, "int4z": 4}


def delta_bits(codec: str) -> Bits:
    """Bits per code of a delta codec (frame ``int8``/``int8z``: 8, ``int4``/``int4z``: 4;
    run ``int8``: 8, ``int4``: 4)."""
    return _BITS[codec]


def wire_bits(wire: WireCodec) -> Bits | None:
    """The delta width of a run with codec ``wire`` (8 for ``int8``, 4 for ``int4``), or
    None for runs that send full models only (``fp32``, ``fp16``)."""
    return _BITS.get(wire)


def downlink_codec(wire: WireCodec) -> FrameCodec:
    """How the server sends full models in a run with codec ``wire``: float16 for
    ``fp16``, ``int8`` and ``int4`` runs. In the last two a start model goes as a delta instead
    when the server knows what the device holds (``server/downlink.py``)."""
    return "raw" if wire == "fp32" else "fp16"


def first_codec(wire: WireCodec) -> FrameCodec:
    """How the server sends a whole start model, in a run with codec ``wire``, to a
    device that holds no model it knows and decodes ``q8``: ``q8`` in ``int8`` and
    ``int4`` runs (the next delta corrects its error), else :func:`downlink_codec`."""
    return "q8" if wire in DELTA_WIRE_CODECS else downlink_codec(wire)


def upload_codec(wire: WireCodec) -> FrameCodec:
    """How a device sends its trained model (to the manager or, in a chain, its
    successor) in a run with codec ``wire``."""
    return {"fp32": "raw", "fp16": "fp16", "int8": "int8", "int4": "int4"}[wire]  # type: ignore[return-value]


def payload_key(encoded: np.ndarray) -> str:
    """The sha256 of an encoded payload's little-endian bytes: its frame's ``sha256``,
    and the ``base`` a delta against it names."""
    arr = np.ascontiguousarray(encoded)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return hashlib.sha256(arr.reshape(-1).view(np.uint8).data).hexdigest()


# -- float codecs ------------------------------------------------------------------------------
def encode_float(weights: np.ndarray, codec: FrameCodec) -> np.ndarray:
    """Full weights as ``raw`` (float32), ``fp16`` (float16) or ``q8`` (8-bit blocks) payload.

    Non-finite weights are encoded as they are in ``raw`` and ``fp16`` (float16 turns
    values beyond 65504 into infinities): the receiver refuses them, naming the reason.

    Raises
    ------
    ValueError
        For a delta codec: a delta needs a base (:class:`ErrorFeedback`); for ``q8``
        of non-finite weights, which 8-bit blocks cannot hold.
    """
    x = np.asarray(weights, np.float32).reshape(-1)
    if codec == "raw":
        return x
    if codec == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if codec == "q8":
        return quantise(x, 8)
    raise ValueError(f"{codec!r} is not a full-model codec")


# -- int8 / int4 deltas -----------------------------------------------------------------------
def code_bytes(n: int, bits: Bits = 8) -> int:
    """Bytes of the codes of ``n`` values (int4: two per byte, the first in the low nibble)."""
    return -(-n * bits // 8)


def delta_length(n: int, bits: Bits = 8) -> int:
    """Bytes of the ``int8`` (``bits`` 8) or ``int4`` (4) payload of ``n`` values."""
    return code_bytes(n, bits) + 8 * -(-n // BLOCK)


def int8_length(n: int) -> int:
    """Bytes of the ``int8`` payload of ``n`` values."""
    return delta_length(n, 8)


def _head_blocks(total: int, bits: Bits) -> int:
    """Blocks of a payload of ``total`` bytes (whole blocks fill ``8 + BLOCK * bits / 8``
    bytes, a partial last one fewer)."""
    return -(-total // (8 + BLOCK * bits // 8))


def quantise(delta: np.ndarray, bits: Bits = 8) -> np.ndarray:
    """The ``int8`` (``bits`` 8) or ``int4`` (4) payload of ``delta``: per block of
    :data:`BLOCK`, a float32 scale and offset, then the codes (layout and error bound in
    the module docstring)."""
    d = np.asarray(delta, np.float32).reshape(-1)
    if not np.isfinite(d).all():
        raise ValueError("delta holds NaN or infinite values")
    n = d.size
    nb = -(-n // BLOCK)
    levels = (1 << bits) - 1
    padded = np.zeros(nb * BLOCK, np.float32)
    padded[:n] = d
    if n % BLOCK:
        padded[n:] = d[(nb - 1) * BLOCK]  # pad with a value of the last block: its range is unchanged
    blocks = padded.reshape(nb, BLOCK)
    lo = blocks.min(axis=1)
    scale = (blocks.max(axis=1) - lo) / np.float32(levels)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    codes = np.rint((blocks - lo[:, None]) / safe[:, None])
    codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(-1)[:n]
    if bits == 4:
        codes = _to_nibbles(codes)
    head = np.concatenate([scale.astype("<f4"), lo.astype("<f4")]).view(np.uint8)
    return np.concatenate([head, codes])


def _to_nibbles(codes: np.ndarray) -> np.ndarray:
    """4-bit codes two per byte, the first in the low nibble (an odd count ends in a 0)."""
    if codes.size % 2:
        codes = np.concatenate([codes, np.zeros(1, np.uint8)])
    return codes[0::2] | (codes[1::2] << 4)


def _from_nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` 4-bit codes of ``packed`` (:func:`_to_nibbles`), one per byte."""
    out = np.empty(2 * packed.size, np.uint8)
    out[0::2] = packed & 0x0F
    out[1::2] = packed >> 4
    return out[:n]


def pack(payload: np.ndarray, *, bits: Bits) -> tuple[np.ndarray, FrameCodec]:
    """A delta payload as it goes on the wire: ``int8z`` / ``int4z`` (codes deflated) if
    that is smaller, else as it is (``int8`` / ``int4``). ``bits``: the payload's code
    width (no default: the header's length depends on it)."""
    nb = _head_blocks(payload.size, bits)
    packed = np.concatenate([payload[: 8 * nb], np.frombuffer(zlib.compress(payload[8 * nb :].tobytes()), np.uint8)])
    plain, deflated = ("int8", "int8z") if bits == 8 else ("int4", "int4z")
    return (packed, deflated) if packed.size < payload.size else (payload, plain)  # type: ignore[return-value]


def unpack(packed: np.ndarray, n: int, *, bits: Bits) -> np.ndarray:
    """The ``int8`` (``int4``) payload of ``n`` values an ``int8z`` (``int4z``) payload holds.

    Raises
    ------
    ProtocolError
        If the stream is corrupt, or inflates to more or fewer bytes than the codes of
        ``n`` values (it is never inflated beyond them).
    """
    name = f"int{bits}z"
    if n <= 0:  # zlib reads a limit of 0 as none at all
        raise ProtocolError(f"an {name} payload against an empty base")
    nb = -(-n // BLOCK)
    want = code_bytes(n, bits)
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size <= 8 * nb:
        raise ProtocolError(f"an {name} payload of {packed.size} bytes cannot hold {n} values")
    inflater = zlib.decompressobj()
    try:
        codes = inflater.decompress(packed[8 * nb :].tobytes(), want)
    except zlib.error as e:
        raise ProtocolError(f"an {name} payload's codes do not inflate (corrupt): {e}") from None
    if len(codes) != want or inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
        raise ProtocolError(f"an {name} payload's codes do not inflate to exactly {want} bytes (corrupt or oversized)")
    return np.concatenate([packed[: 8 * nb], np.frombuffer(codes, np.uint8)])


def dequantise(payload: np.ndarray, n: int | None = None, bits: Bits = 8, name: str | None = None) -> np.ndarray:
    """The float32 values an ``int8`` (``bits`` 8) or ``int4`` (4) payload holds: a
    delta, or a whole model in a ``q8`` payload.

    Parameters
    ----------
    payload : the payload (uint8).
    n : the number of values; by default as many as the codes hold (an ``int4``
        payload of an odd count holds one code more, which ``n`` drops).
    bits : 8 or 4.
    name : the codec named in errors (default ``int8`` or ``int4``).

    Raises
    ------
    ProtocolError
        If the length fits no number of values (or not ``n``), or a scale or offset is
        negative or not finite (a corrupt payload).
    """
    raw = np.asarray(payload)
    name = name or f"int{bits}"
    an = f"a {name}" if name == "q8" else f"an {name}"  # for the errors
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ProtocolError(f"{an} payload is a 1-D uint8 array, got {raw.dtype} {raw.shape}")
    total = raw.size
    nb = _head_blocks(total, bits)
    if n is not None and delta_length(n, bits) != total:
        raise ProtocolError(f"{an} delta of {total} bytes does not fit a model of {n} values")
    n = (total - 8 * nb) * 8 // bits if n is None else n
    if n <= 0 or delta_length(n, bits) != total:
        raise ProtocolError(f"{an} payload of {total} bytes fits no number of values (blocks of {BLOCK})")
    head = raw[: 8 * nb].view("<f4").astype(np.float32)
    scale, lo = head[:nb], head[nb:]
    if not (np.isfinite(head).all() and (scale >= 0).all()):
        raise ProtocolError(f"{an} payload holds a negative or non-finite scale or offset (corrupt)")
    if bits == 4 and n % 2 and raw[-1] >> 4:
        raise ProtocolError("an int4 payload of an odd count must end in a zero nibble (corrupt)")
    codes = raw[8 * nb :] if bits == 8 else _from_nibbles(raw[8 * nb :], n)
    if n % BLOCK:  # the last block padded to a whole one: every block then scales as a row
        codes = np.concatenate([codes, np.zeros(nb * BLOCK - n, np.uint8)])
    blocks = codes.reshape(nb, BLOCK).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # a corrupt scale: refused just below
        blocks *= scale[:, None]  # lo + q * s, as in the module docstring, one block per row
        blocks += lo[:, None]
    out = blocks.reshape(-1)[:n]
    if not np.isfinite(out).all():
        raise ProtocolError(f"{an} payload decodes to non-finite values (corrupt)")
    return out


class ErrorFeedback:
    """A sender's residual of its last int8 or int4 quantisation (error feedback).

    One per sender and model; kept in memory (a restarted device starts again from
    zero, which only loses the last residual)."""

    def __init__(self) -> None:
        self.residual: np.ndarray | None = None

    def encode(self, weights: np.ndarray, base: np.ndarray, bits: Bits = 8) -> np.ndarray:
        """The ``int8`` (``bits`` 8) or ``int4`` (4) payload of ``weights - base`` plus
        the carried residual; keeps the new residual."""
        target = np.asarray(weights, np.float32) - np.asarray(base, np.float32)
        if self.residual is not None and self.residual.shape == target.shape:
            target = target + self.residual
        payload = quantise(target, bits)
        self.residual = target - dequantise(payload, target.size, bits)
        return payload


def encode_output(
    weights: np.ndarray, start: np.ndarray, codec: FrameCodec, feedback: ErrorFeedback
) -> tuple[np.ndarray, FrameCodec]:
    """What a device sends for its trained ``weights``: the payload and its codec.

    ``int8`` (``int4``): the delta against ``start`` (the model it trained from, as received)
    through the device's ``feedback``, deflated if that is smaller (:func:`pack`);
    non-finite weights cannot be quantised and go ``raw``, for the receiver to refuse
    with the reason. Other codecs: the weights."""
    if codec in DELTA_CODECS:
        if np.isfinite(weights).all():
            bits = delta_bits(codec)
            return pack(feedback.encode(weights, start, bits), bits=bits)
        codec = "raw"
    return encode_float(weights, codec), codec


# -- receivers --------------------------------------------------------------------------------
def decode(encoded: np.ndarray, codec: str, base: np.ndarray | None = None) -> np.ndarray:
    """The float32 weights a payload carries.

    Parameters
    ----------
    encoded : the payload as it arrived (float32, float16 or uint8).
    codec : the header's ``codec``.
    base : the model the delta is against (delta codecs only).

    Raises
    ------
    ProtocolError
        For an unknown codec, a payload whose dtype does not fit its codec, a
        delta without its base or of another length, or a corrupt payload.
    """
    arr = np.asarray(encoded).reshape(-1)
    expected = {"raw": np.float32, "fp16": np.float16, "q8": np.uint8}.get(
        codec, np.uint8 if codec in DELTA_CODECS else None
    )
    if expected is None:
        raise ProtocolError(f"unknown codec {codec!r} (this receiver decodes {', '.join(FRAME_CODECS)})")
    if arr.dtype != expected:
        raise ProtocolError(f"a {codec} model payload must be {np.dtype(expected).name}, got {arr.dtype}")
    if codec == "q8":
        return dequantise(arr, None, 8, name="q8")
    if codec not in DELTA_CODECS:
        return arr.astype(np.float32, copy=False)
    if base is None:
        raise ProtocolError(f"an {codec} delta without the base model it is against")
    n, bits = np.asarray(base).size, delta_bits(codec)
    delta = dequantise(unpack(arr, n, bits=bits) if codec.endswith("z") else arr, n, bits)
    delta += np.asarray(base, np.float32).reshape(-1)  # the base plus the delta, in place of the delta
    return delta
