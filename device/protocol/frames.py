"""Binary model frames: a checked JSON header and raw little-endian tensor bytes.

``b"CVY2" | uint32 LE header length | header (UTF-8 JSON) | payload chunk``

The header (:class:`FrameHeader`) names the kind, run, round, group (``-1`` for
none), sender, message id, chunk index and count, the chunk size, dtype, shape, byte
count, the codec of the payload (``device/protocol/codecs.py``; an ``int8`` or ``int4`` delta also
names its ``base``) and the sha256 of the *whole* payload as sent (the encoded bytes,
not the weights they decode to). Payloads above
``max_chunk`` bytes travel as several frames (EMQX's default packet limit is 1 MB)
and are checked against the sha256 once reassembled. Nothing here is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol, cast

import numpy as np

from device.errors import ProtocolError
from device.protocol.codecs import DELTA_CODECS, FrameCodec, decode, delta_bits, delta_length
from device.protocol.typed import AtLeast, Identifier, MaxLen, from_body, to_body

log = logging.getLogger("covey.protocol")

MAGIC = b"CVY2"
DEFAULT_MAX_CHUNK = 900_000  # bytes of payload per frame: under a 1 MB broker packet limit
MAX_HEADER = 4096
FrameKind = Literal["model", "update", "artifact", "handoff", "result", "probe", "echo"]
FRAME_KINDS: tuple[str, ...] = ("model", "update", "artifact", "handoff", "result", "probe", "echo")
Dtype = Literal["float32", "float16", "uint8"]
DTYPES = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8}
_CODEC_DTYPES = {"raw": ("float32", "uint8"), "fp16": ("float16",), "q8": ("uint8",)} | {
    c: ("uint8",) for c in DELTA_CODECS
}


@dataclass(frozen=True)
class FrameExtra:
    """What a frame is for, by kind.

    ``model`` (server to device): ``task_id`` and ``index`` (the i-th model of an
    evaluate request), or ``shared`` (the key of a shared model). ``handoff`` (device
    to its successor): ``task_id`` of the *successor's* task and ``position`` of the
    sender in the chain. ``result`` (device to its group manager): the sender's own
    ``task_id`` and ``position``. ``update`` (pre-training reply): ``task_id``.
    ``artifact``: nothing. ``probe`` (a link measurement, device to server or peer,
    uint8 filler) and ``echo`` (its empty answer): ``task_id`` of the link-probe
    request and ``index``, the probe's sequence number."""

    task_id: Annotated[str, Identifier("task id")] | None = None
    index: Annotated[int, AtLeast(0)] = 0
    position: Annotated[int, AtLeast(0)] | None = None
    shared: Annotated[str, Identifier("model key")] | None = None


_NEEDS: dict[str, tuple[str, ...]] = {
    "handoff": ("task_id", "position"),
    "result": ("task_id", "position"),
    "update": ("task_id",),
    "probe": ("task_id",),
    "echo": ("task_id",),
}


@dataclass(frozen=True)
class FrameHeader:
    """The header of one frame (every field required but ``codec``, ``base`` and
    ``extra``). ``codec`` says how the payload decodes (``raw``: the array's bytes,
    float32 or uint8; ``fp16``: float16 weights; ``int8``, ``int4`` and their deflated
    forms ``int8z``, ``int4z``: a quantised delta, uint8; ``q8``: a whole model in
    8-bit blocks, uint8); ``base``: for deltas only and then required, the sha256 of
    the payload of the model the delta is against."""

    kind: FrameKind
    run: Annotated[str, Identifier("run id")]
    round: Annotated[int, AtLeast(0)]
    group: Annotated[int, AtLeast(-1)]
    sender: Annotated[str, Identifier("sender")]
    msg_id: Annotated[str, Identifier("message id")]
    chunk: Annotated[int, AtLeast(0)]
    n_chunks: Annotated[int, AtLeast(1)]
    chunk_size: Annotated[int, AtLeast(1)]
    dtype: Dtype
    shape: Annotated[tuple[Annotated[int, AtLeast(0)], ...], MaxLen(8)]
    nbytes: Annotated[int, AtLeast(0)]
    sha256: str
    codec: FrameCodec = "raw"
    extra: FrameExtra = field(default_factory=FrameExtra)
    base: str | None = None

    def __post_init__(self) -> None:
        if self.n_chunks > 100_000 or self.chunk >= self.n_chunks:
            raise ValueError(f"chunk {self.chunk} of {self.n_chunks} is out of range")
        if self.n_chunks != max(1, -(-self.nbytes // self.chunk_size)):  # integer ceil: no float overflow
            raise ValueError(f"{self.n_chunks} chunks of {self.chunk_size} bytes cannot carry {self.nbytes} bytes")
        if math.prod(self.shape) * np.dtype(DTYPES[self.dtype]).itemsize != self.nbytes:
            raise ValueError(f"shape {list(self.shape)} of {self.dtype} does not hold {self.nbytes} bytes")
        if not _is_sha256(self.sha256):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        if self.dtype not in _CODEC_DTYPES[self.codec]:
            raise ValueError(f"a {self.codec} payload cannot be {self.dtype}")
        if (self.codec in DELTA_CODECS) != (self.base is not None):
            raise ValueError("a delta frame (int8, int8z, int4, int4z) names its base, and only those do")
        if self.base is not None and not _is_sha256(self.base):
            raise ValueError("base must be 64 lowercase hex digits (the base payload's sha256)")
        missing = [k for k in _NEEDS.get(self.kind, ()) if getattr(self.extra, k) is None]
        if self.kind == "model" and self.extra.task_id is None and self.extra.shared is None:
            missing.append("task_id or shared")
        if missing:
            raise ValueError(f"a {self.kind} frame needs extra.{' and extra.'.join(missing)}")

    def chunk_length(self, index: int) -> int:
        """Payload bytes chunk ``index`` must carry."""
        if index < self.n_chunks - 1:
            return self.chunk_size
        return self.nbytes - self.chunk_size * (self.n_chunks - 1)


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _is_sha256(text: str) -> bool:
    return _SHA256_HEX.fullmatch(text) is not None


@dataclass(frozen=True)
class TransferTiming:
    """How fast a multi-chunk payload arrived: the bytes of every chunk after the first
    and the seconds from the first chunk's arrival to the last's. The sender publishes
    its chunks back to back, so their spacing at the receiver is set by the slowest link
    on the path (packet-train dispersion): a goodput measured on the transfer itself,
    with no clock shared between sender and receiver and no latency in it."""

    nbytes: int
    seconds: float

    @property
    def goodput_bps(self) -> float | None:
        """Payload bits per second; ``None`` when the arrivals were too close to time."""
        return 8.0 * self.nbytes / self.seconds if self.seconds >= MIN_TIMED_S else None


MIN_TIMED_S = 1e-3  # spacing below a millisecond is timer and scheduling noise, not a rate


@dataclass(frozen=True)
class Payload:
    """A reassembled, checked model payload; ``timing``: how fast it arrived (payloads
    of two or more chunks only, see :class:`TransferTiming`)."""

    header: FrameHeader
    array: np.ndarray
    timing: TransferTiming | None = None


def _frame_parts(
    array: np.ndarray,
    *,
    kind: FrameKind,
    run: str,
    round: int,
    group: int,
    sender: str,
    max_chunk: int,
    extra: FrameExtra | None,
    msg_id: str | None,
    codec: FrameCodec,
    base: str | None,
    digest: Callable[[memoryview], str],
) -> tuple[dict[str, Any], memoryview, int]:
    """The header body (chunk 0), the payload's bytes (a view, little-endian) and the
    chunk count of ``array``'s frames; ``digest`` gives the header's sha256."""
    arr = np.ascontiguousarray(array)
    # by kind and width, whatever the byte order: a big-endian array is swapped below
    dtype = next((name for name, t in DTYPES.items() if arr.dtype.newbyteorder("=") == t), None)
    if dtype is None:
        raise ProtocolError(f"dtype {arr.dtype} cannot travel in a frame (float32, float16 or uint8)")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.byteswap().view(arr.dtype.newbyteorder("<"))
    data = memoryview(arr.reshape(-1).view(np.uint8).data)  # no copy: frames are cut from the array itself
    n_chunks = max(1, math.ceil(len(data) / max_chunk))
    header = FrameHeader(
        kind=kind,
        run=run,
        round=int(round),
        group=int(group),
        sender=sender,
        msg_id=msg_id or uuid.uuid4().hex[:16],
        chunk=0,
        n_chunks=n_chunks,
        chunk_size=max_chunk,
        dtype=dtype,  # type: ignore[arg-type]
        shape=tuple(int(d) for d in arr.shape),
        nbytes=len(data),
        sha256=digest(data),
        codec=codec,
        extra=extra or FrameExtra(),
        base=base,
    )
    return to_body(header), data, n_chunks


def _head(body: dict[str, Any], chunk: int) -> bytes:
    body["chunk"] = chunk
    return json.dumps(body, separators=(",", ":")).encode()


def encode_frames(
    array: np.ndarray,
    *,
    kind: FrameKind,
    run: str,
    round: int,
    group: int,
    sender: str,
    max_chunk: int = DEFAULT_MAX_CHUNK,
    extra: FrameExtra | None = None,
    msg_id: str | None = None,
    codec: FrameCodec = "raw",
    base: str | None = None,
) -> Iterator[bytes]:
    """Frames carrying ``array`` (little-endian), chunked above ``max_chunk`` bytes.

    ``array`` is the payload as encoded by ``codec`` (``device/protocol/codecs.py``);
    ``base`` names the model a delta (``int8``, ``int4``) is against."""
    body, data, n_chunks = _frame_parts(
        array,
        kind=kind,
        run=run,
        round=round,
        group=group,
        sender=sender,
        max_chunk=max_chunk,
        extra=extra,
        msg_id=msg_id,
        codec=codec,
        base=base,
        digest=lambda d: hashlib.sha256(d).hexdigest(),
    )
    for i in range(n_chunks):
        head = _head(body, i)
        yield b"".join((MAGIC, struct.pack("<I", len(head)), head, data[i * max_chunk : (i + 1) * max_chunk]))


def frames_size(
    array: np.ndarray,
    *,
    kind: FrameKind,
    run: str,
    round: int,
    group: int,
    sender: str,
    max_chunk: int = DEFAULT_MAX_CHUNK,
    extra: FrameExtra | None = None,
    msg_id: str | None = None,
    codec: FrameCodec = "raw",
    base: str | None = None,
) -> int:
    """The total length of :func:`encode_frames`' frames for the same arguments, without
    hashing or copying the payload (a sha256 is always 64 hex digits; what the
    simulator counts for every model it moves)."""
    body, data, n_chunks = _frame_parts(
        array,
        kind=kind,
        run=run,
        round=round,
        group=group,
        sender=sender,
        max_chunk=max_chunk,
        extra=extra,
        msg_id=msg_id or "0" * 16,
        codec=codec,
        base=base,
        digest=lambda d: "0" * 64,
    )
    return _frames_length(body, data, n_chunks)


def _frames_length(body: dict[str, Any], data: memoryview, n_chunks: int) -> int:
    """The total length of the ``n_chunks`` frames that carry ``data`` under ``body``."""
    heads = sum(len(_head(dict(body), i)) for i in range(n_chunks))
    return n_chunks * (len(MAGIC) + 4) + heads + len(data)


Publish = Callable[[str, bytes, bool], None]  # (topic, payload, retain): how anything is sent


def whole_payload(
    array: np.ndarray,
    *,
    kind: FrameKind,
    run: str,
    round: int,
    group: int,
    sender: str,
    max_chunk: int = DEFAULT_MAX_CHUNK,
    extra: FrameExtra | None = None,
    codec: FrameCodec = "raw",
    base: str | None = None,
    hashed: bool = True,
) -> tuple[Payload, int]:
    """What :func:`encode_frames`' frames would deliver, as one :class:`Payload` holding a
    read-only view of ``array`` itself (a receiver that wrote into it would raise), and
    the total length of those frames: how an in-process bus moves a model without
    copying it (:func:`send_model`).

    ``hashed=False``: the header's ``sha256`` is a unique token instead of the payload's
    hash, for a run in which nothing names a model by its hash (no ``int8``/``int4``
    deltas: no base, no downlink bookkeeping) and nothing is reassembled to check it."""
    body, data, n_chunks = _frame_parts(
        array,
        kind=kind,
        run=run,
        round=round,
        group=group,
        sender=sender,
        max_chunk=max_chunk,
        extra=extra,
        msg_id=None,
        codec=codec,
        base=base,
        digest=(lambda d: hashlib.sha256(d).hexdigest()) if hashed else (lambda d: uuid.uuid4().hex * 2),
    )
    header = from_body(FrameHeader, dict(body), "frame header")
    view = np.frombuffer(data, DTYPES[header.dtype]).reshape(header.shape)  # little-endian here, as framed
    view.flags.writeable = False
    return Payload(header, view), _frames_length(body, data, n_chunks)


class Carrier(Protocol):
    """A :data:`Publish` that can also take a model payload whole (the simulator's
    in-process bus, ``server/simulation/virtual_bus.py``)."""

    carries: frozenset[FrameCodec]  # the codecs it takes whole; the rest go as frames
    hashes: bool  # whether a payload it takes whole needs its real sha256 (whole_payload's ``hashed``)

    def __call__(self, topic: str, data: bytes, retain: bool) -> None: ...

    def carry(self, topic: str, payload: Payload, size: int, retain: bool) -> None:
        """Deliver ``payload`` (``size``: the bytes of its frames) as its frames would be."""


def send_model(
    publish: Publish,
    topic: str | Callable[[int], str],
    array: np.ndarray,
    *,
    kind: FrameKind,
    run: str,
    round: int,
    group: int,
    sender: str,
    max_chunk: int = DEFAULT_MAX_CHUNK,
    extra: FrameExtra | None = None,
    retain: bool = False,
    codec: FrameCodec = "raw",
    base: str | None = None,
) -> int:
    """Encode ``array`` into frames and publish each; returns the number of frames.

    ``topic`` is one topic for every chunk, or a function of the chunk index (the
    retained artifact and shared models keep one retained message per chunk).
    ``array`` is already encoded by ``codec`` (``base``: see :func:`encode_frames`).
    A :class:`Carrier` that carries ``codec`` gets the payload whole instead, on the
    first chunk's topic."""
    if codec in getattr(publish, "carries", ()):
        payload, size = whole_payload(
            array,
            kind=kind,
            run=run,
            round=round,
            group=group,
            sender=sender,
            max_chunk=max_chunk,
            extra=extra,
            codec=codec,
            base=base,
            hashed=cast(Carrier, publish).hashes,
        )
        cast(Carrier, publish).carry(topic if isinstance(topic, str) else topic(0), payload, size, retain)
        return payload.header.n_chunks
    n = 0
    frames = encode_frames(
        array,
        kind=kind,
        run=run,
        round=round,
        group=group,
        sender=sender,
        max_chunk=max_chunk,
        extra=extra,
        codec=codec,
        base=base,
    )
    for i, frame in enumerate(frames):
        publish(topic if isinstance(topic, str) else topic(i), frame, retain)
        n = i + 1
    return n


def parse_frame(frame: bytes, max_frame: int = 64 * 1024 * 1024) -> tuple[FrameHeader, memoryview]:
    """Split and validate one frame; raises :class:`ProtocolError` naming the problem."""
    if len(frame) > max_frame:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the {max_frame}-byte limit")
    if frame[:3] == b"CVY" and len(frame) >= 4 and frame[:4] != MAGIC:
        raise ProtocolError(f"frame of protocol version {frame[3:4].decode(errors='replace')}, expected 2")
    if frame[:4] != MAGIC:
        raise ProtocolError("not a covey frame (bad magic)")
    if len(frame) < 8:
        raise ProtocolError(f"frame of {len(frame)} bytes, truncated before its header length")
    (head_len,) = struct.unpack("<I", frame[4:8])
    if head_len > MAX_HEADER or 8 + head_len > len(frame):
        raise ProtocolError(f"frame header length {head_len} does not fit the {len(frame)}-byte frame (truncated)")
    try:
        raw: Any = json.loads(frame[8 : 8 + head_len].decode())
    except (ValueError, RecursionError):  # not UTF-8, not JSON, too deep
        raise ProtocolError("frame header is not UTF-8 JSON (or nests too deeply)") from None
    header = from_body(FrameHeader, raw, "frame header")
    chunk = memoryview(frame)[8 + head_len :]  # the payload chunk, not copied
    if len(chunk) != header.chunk_length(header.chunk):
        raise ProtocolError(
            f"chunk {header.chunk} carries {len(chunk)} bytes; the header says {header.chunk_length(header.chunk)}"
            " (truncated or padded)"
        )
    return header, chunk


class _Quota:
    """Logs at most ``burst`` lines per ``window_s`` seconds; then counts, and says how
    many it held back with the next line it lets through ("… and 94,371 more")."""

    def __init__(self, burst: int = 5, window_s: float = 60.0) -> None:
        self.burst, self.window_s = burst, window_s
        self._since, self._shown, self.held_back = -float("inf"), 0, 0

    def warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._since > self.window_s:
            if self.held_back:
                log.warning("... and %d more like it in %.0f s", self.held_back, now - self._since)
            self._since, self._shown, self.held_back = now, 0, 0
        if self._shown < self.burst:
            self._shown += 1
            log.warning(message, *args)
        else:
            self.held_back += 1


class Reassembler:
    """Collects chunks by message id; returns the checked payload when complete.

    Memory is bounded by bytes: a payload larger than ``max_bytes`` is refused; every
    chunk must carry exactly the bytes its header announces, so what the partial
    messages hold never exceeds what they announce; together they may announce at
    most ``max_pending_bytes``, and a new message that does not fit evicts the oldest
    partial ones (logged and counted in ``evicted``). With ``max_pending_per_sender``,
    one sender's partial messages may announce at most that much: its own oldest are
    evicted first, so one sender cannot crowd out the others. Partial messages
    untouched for ``max_age_s`` seconds expire (counted in ``expired``). A device expects a model or
    two at a time; the coordinator receives one model per device of a parallel round at
    once (50 devices x 26 MB interleaved), so it passes a bound that fits them all.
    """

    def __init__(
        self,
        max_bytes: int = 256 * 1024 * 1024,
        max_pending_bytes: int = 1024 * 1024 * 1024,
        max_age_s: float = 600.0,
        max_pending_per_sender: int | None = None,
    ) -> None:
        self.max_bytes, self.max_pending_bytes, self.max_age_s = max_bytes, max_pending_bytes, max_age_s
        self.max_pending_per_sender = max_pending_per_sender
        self._parts: dict[str, tuple[FrameHeader, dict[int, memoryview], float]] = {}
        self._first_at: dict[str, tuple[float, int]] = {}  # when each partial message's first chunk arrived, its bytes
        self.evicted = 0
        self.expired = 0
        self._log = _Quota()  # a flood of partial payloads is counted, not logged line by line

    @property
    def pending_bytes(self) -> int:
        return sum(h.nbytes for h, _, _ in self._parts.values())

    @property
    def held_bytes(self) -> int:
        return sum(len(c) for _, parts, _ in self._parts.values() for c in parts.values())

    def _expire(self, now: float) -> None:
        old = [k for k, (_, _, seen) in self._parts.items() if now - seen > self.max_age_s]
        for key in old:
            head, _, _ = self._parts.pop(key)
            self._first_at.pop(key, None)
            self.expired += 1
            self._log.warn("dropped the partial %s payload %s: no chunk for %.0f s", head.kind, key, self.max_age_s)

    def _make_room(self, nbytes: int, sender: str) -> None:
        if self.max_pending_per_sender is not None:
            mine = [k for k, (h, _, _) in self._parts.items() if h.sender == sender]
            own = sum(self._parts[k][0].nbytes for k in mine)
            while mine and own + nbytes > self.max_pending_per_sender:
                oldest = min(mine, key=lambda k: self._parts[k][2])
                mine.remove(oldest)
                own -= self._evict(oldest, f"more than {self.max_pending_per_sender} bytes pending from {sender}")
        pending = self.pending_bytes
        while self._parts and pending + nbytes > self.max_pending_bytes:
            oldest = min(self._parts, key=lambda k: self._parts[k][2])
            pending -= self._evict(oldest, f"more than {self.max_pending_bytes // 2**20} MB of partial payloads")

    def _evict(self, key: str, why: str) -> int:
        """Drop the partial message ``key`` (logged, counted); returns what it announced."""
        head, parts, _ = self._parts.pop(key)
        self._first_at.pop(key, None)
        self.evicted += 1
        self._log.warn(
            "evicted the partial %s frame %s from %s (%d of %d chunks): %s",
            head.kind,
            key,
            head.sender,
            len(parts),
            head.n_chunks,
            why,
        )
        return head.nbytes

    def add(self, frame: bytes, sender: str | None = None, received_at: float | None = None) -> Payload | None:
        """Take one frame; the whole checked payload once its last chunk arrived.

        ``sender``: who the broker says sent it (from the topic). A frame whose
        header names anyone else is refused before it is stored. ``received_at``: the
        ``time.monotonic()`` at which the network took the frame (default: now); the
        payload's :class:`TransferTiming` is measured from these."""
        header, chunk = parse_frame(frame)
        if sender is not None and header.sender != sender:
            raise ProtocolError(f"frame claims sender {header.sender!r} but came from {sender!r}")
        if header.nbytes > self.max_bytes:
            raise ProtocolError(f"payload of {header.nbytes} bytes exceeds the {self.max_bytes}-byte limit")
        now = time.monotonic()
        self._expire(now)
        arrived = now if received_at is None else received_at
        key = f"{header.sender}/{header.msg_id}"
        if header.n_chunks > 1 and key not in self._parts:
            self._make_room(header.nbytes, header.sender)
        first, parts, _ = self._parts.get(key, (header, {}, now))
        if (first.sha256, first.n_chunks, first.nbytes, first.chunk_size) != (
            header.sha256,
            header.n_chunks,
            header.nbytes,
            header.chunk_size,
        ):
            self._parts.pop(key, None)
            self._first_at.pop(key, None)
            raise ProtocolError(f"chunks of message {header.msg_id} disagree about the payload")
        parts[header.chunk] = chunk
        self._parts[key] = (first, parts, now)
        first_at, first_bytes = self._first_at.setdefault(key, (arrived, len(chunk)))
        if len(parts) < header.n_chunks:
            return None
        self._parts.pop(key, None)
        self._first_at.pop(key, None)
        timing = None
        if header.n_chunks > 1:
            timing = TransferTiming(header.nbytes - first_bytes, max(0.0, arrived - first_at))
        data = parts[0] if header.n_chunks == 1 else _join_releasing(parts, header)
        if hashlib.sha256(data).hexdigest() != header.sha256:
            raise ProtocolError(f"payload sha256 mismatch for message {header.msg_id}: corrupted in transit")
        array = np.frombuffer(data, dtype=np.dtype(DTYPES[header.dtype]).newbyteorder("<")).reshape(header.shape)
        return Payload(first, array.astype(DTYPES[header.dtype], copy=False), timing)


def _join_releasing(parts: dict[int, memoryview], header: FrameHeader) -> memoryview:
    """The chunks of one payload in one writable buffer, each chunk let go of once
    copied: joining adds one chunk to the memory a payload takes, not a second payload
    (26 MB for the FEMNIST CNN on a device). The buffer is writable, so a device can
    train into the start model it holds (``TFLiteModel.train(reuse_start=True)``)."""
    out = np.empty(header.nbytes, np.uint8)
    for index in range(header.n_chunks):
        chunk = parts.pop(index)
        start = index * header.chunk_size
        out[start : start + len(chunk)] = np.frombuffer(chunk, np.uint8)
        chunk.release()  # the frame it came in can go now (nothing else holds it once read)
    return out.data


def check_weights(payload: Payload, n_params: int, bases: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """The finite float32 vector of the model's length a model payload decodes to.

    ``bases``: the models this receiver holds, by the sha256 of the payload they came
    in, for ``int8`` and ``int4`` deltas (``device/protocol/codecs.py``). A delta against a base
    the receiver does not hold, an unknown codec, a payload of the wrong dtype or
    length, or NaN weights are refused (:class:`ProtocolError`)."""
    h = payload.header
    if payload.array.ndim != 1:
        raise ProtocolError(f"weights must be a 1-D vector, got shape {payload.array.shape}")
    base = None
    if h.base is not None:
        base = (bases or {}).get(h.base)
        if base is None:
            raise ProtocolError(f"an {h.codec} delta against base {h.base[:16]}, a model this receiver does not hold")
    if h.codec in DELTA_CODECS:
        size, full = payload.array.shape[0], delta_length(n_params, delta_bits(h.codec))
        if not h.codec.endswith("z") and size != full:
            raise ProtocolError(f"an {h.codec} delta of {size} bytes does not fit a model of {n_params}")
        if h.codec.endswith("z") and size >= full:
            raise ProtocolError(f"an {h.codec} delta of {size} bytes is no smaller than its {h.codec[:-1]} payload")
    if h.codec == "q8" and payload.array.shape[0] != delta_length(n_params, 8):  # before decoding any of it
        raise ProtocolError(f"a q8 model of {payload.array.shape[0]} bytes does not fit a model of {n_params}")
    arr = decode(payload.array, h.codec, base)
    if arr.shape[0] != n_params:
        raise ProtocolError(f"weights have {arr.shape[0]} values; the model has {n_params}")
    if not np.isfinite(arr).all():
        raise ProtocolError("weights hold NaN or infinite values")
    return arr
