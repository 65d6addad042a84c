"""covey's wire protocol: topics, control messages and binary model frames.

Every party (device agents, coordinator, group managers, third-party devices) speaks
this module. See ``docs/protocol.md`` for the reference a new device can be written
from. Nothing here is ever unpickled: control messages are JSON, model payloads are
raw little-endian tensor bytes behind a checked header.

Topics (all rooted at ``covey/<run>/``)
---------------------------------------
``server/register``            device -> server   registration (JSON)
``server/results``             device -> server   results, pongs, acks (JSON)
``server/frames``              device -> server   model frames for the server (pre-training updates)
``device/<id>/inbox``          server -> device   requests (JSON)
``device/<id>/frames``         any -> device      model frames (start models, hand-offs)
``device/<id>/status``         device, retained   "online"/"offline" (last will)
``device/<id>/assignment``     server, retained   the device's group in the current round (JSON)
``group/<g>/frames``           device -> manager  chain results and relayed hand-offs
``artifact/manifest``          server, retained   the model manifest (JSON)
``artifact/chunk/<i>``         server, retained   the .tflite file in frames
``shared/<key>/chunk/<i>``     server, retained   a model many devices start from (one copy, the
                                                  broker fans it out); cleared after its round

Frames
------
``b"CVY1" | uint32 LE header length | header (UTF-8 JSON) | payload chunk``. The header
names kind, run, round, group, sender, message id, chunk index and count, dtype,
shape, byte count and the sha256 of the *whole* payload. Payloads above
``max_chunk`` bytes travel as several frames (brokers such as EMQX default to 1 MB
packets) and are checked against the sha256 once reassembled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import struct
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from device.errors import ProtocolError

log = logging.getLogger("covey.protocol")

PROTOCOL_VERSION = 1
SERVER_ID = "server"  # sender id of the coordinator and its group managers
MAGIC = b"CVY1"
DEFAULT_MAX_CHUNK = 900_000  # bytes of payload per frame: under a 1 MB broker packet limit
MAX_HEADER = 4096
FRAME_KINDS = ("model", "update", "artifact", "handoff", "result")
DTYPES = {"float32": np.float32, "uint8": np.uint8}
MESSAGE_TYPES = (
    "register",
    "assignment",
    "train",
    "pretrain",
    "evaluate",
    "resend",
    "ping",
    "pong",
    "result",
    "ack",
    "stop",
)


# -- topics ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Topics:
    """Topic names of one run."""

    run: str

    def __post_init__(self) -> None:
        if not self.run or any(ch in self.run for ch in "/+#") or len(self.run) > 64:
            raise ProtocolError(f"run id {self.run!r} must be 1-64 characters without '/', '+' or '#'")

    @property
    def root(self) -> str:
        return f"covey/{self.run}"

    @property
    def register(self) -> str:
        return f"{self.root}/server/register"

    @property
    def results(self) -> str:
        return f"{self.root}/server/results"

    @property
    def server_frames(self) -> str:
        return f"{self.root}/server/frames"

    def inbox(self, device: str) -> str:
        return f"{self.root}/device/{check_id(device)}/inbox"

    def frames(self, device: str) -> str:
        return f"{self.root}/device/{check_id(device)}/frames"

    def status(self, device: str) -> str:
        return f"{self.root}/device/{check_id(device)}/status"

    def assignment(self, device: str) -> str:
        return f"{self.root}/device/{check_id(device)}/assignment"

    def group_frames(self, group: int) -> str:
        return f"{self.root}/group/{int(group)}/frames"

    @property
    def artifact_manifest(self) -> str:
        return f"{self.root}/artifact/manifest"

    def artifact_chunk(self, index: int) -> str:
        return f"{self.root}/artifact/chunk/{int(index)}"

    def shared_chunk(self, key: str, index: int) -> str:
        return f"{self.root}/shared/{check_id(key, 'model key')}/chunk/{int(index)}"

    def shared_filter(self, key: str) -> str:
        """Subscription filter for every chunk of the shared model ``key``."""
        return f"{self.root}/shared/{check_id(key, 'model key')}/chunk/#"

    @property
    def shared_root(self) -> str:
        return f"{self.root}/shared/"

    @property
    def everything(self) -> str:
        return f"{self.root}/#"


def check_id(value: str, what: str = "device id") -> str:
    """A device id or another topic level (``what`` names it in the error)."""
    if not value or len(value) > 64 or any(ch in value for ch in "/+# ") or not value.isprintable():
        raise ProtocolError(f"{what} {value!r} must be 1-64 printable characters without '/', '+', '#', ' '")
    return value


# -- control messages -------------------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    """A typed, versioned control message (JSON on the wire)."""

    type: str
    run: str
    sender: str
    round: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    sent_at: float = field(default_factory=time.time)
    v: int = PROTOCOL_VERSION

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def decode_message(data: bytes, max_bytes: int = 1_000_000) -> Message:
    """Parse and validate a control message; :class:`ProtocolError` says what is wrong."""
    if len(data) > max_bytes:
        raise ProtocolError(f"control message of {len(data)} bytes exceeds {max_bytes}")
    if data[:4] == MAGIC:
        raise ProtocolError("a binary frame arrived where a control message was expected")
    try:
        raw = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"control message is not UTF-8 JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ProtocolError("control message must be a JSON object")
    if raw.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {raw.get('v')!r} is not {PROTOCOL_VERSION}")
    if raw.get("type") not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {raw.get('type')!r}")
    for key, kind in (("run", str), ("sender", str), ("round", int), ("body", dict), ("id", str)):
        if not isinstance(raw.get(key), kind) or isinstance(raw.get(key), bool):
            raise ProtocolError(f"message field {key!r} is missing or has the wrong type")
    sent_at = raw.get("sent_at", 0.0)
    if not isinstance(sent_at, (int, float)):
        raise ProtocolError("message field 'sent_at' must be a number")
    return Message(raw["type"], raw["run"], raw["sender"], raw["round"], raw["body"], raw["id"], float(sent_at))


# -- frames ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FrameHeader:
    kind: str
    run: str
    round: int
    group: int
    sender: str
    msg_id: str
    chunk: int
    n_chunks: int
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sha256: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Payload:
    """A reassembled, checked model payload."""

    header: FrameHeader
    array: np.ndarray


def encode_frames(
    array: np.ndarray,
    *,
    kind: str,
    run: str,
    round: int,
    group: int,
    sender: str,
    max_chunk: int = DEFAULT_MAX_CHUNK,
    extra: dict[str, Any] | None = None,
    msg_id: str | None = None,
) -> Iterator[bytes]:
    """Frames carrying ``array`` (little-endian), chunked above ``max_chunk`` bytes."""
    if kind not in FRAME_KINDS:
        raise ProtocolError(f"unknown frame kind {kind!r}")
    arr = np.ascontiguousarray(array)
    dtype = next((name for name, t in DTYPES.items() if arr.dtype == t), None)
    if dtype is None:
        raise ProtocolError(f"dtype {arr.dtype} cannot travel in a frame (float32 or uint8)")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.byteswap().view(arr.dtype.newbyteorder("<"))
    data = memoryview(arr.reshape(-1).view(np.uint8).data)  # no copy: frames are cut from the array itself
    digest = hashlib.sha256(data).hexdigest()
    n_chunks = max(1, math.ceil(len(data) / max_chunk))
    mid = msg_id or uuid.uuid4().hex[:16]
    for i in range(n_chunks):
        header = {
            "kind": kind,
            "run": run,
            "round": int(round),
            "group": int(group),
            "sender": sender,
            "msg_id": mid,
            "chunk": i,
            "n_chunks": n_chunks,
            "dtype": dtype,
            "shape": list(arr.shape),
            "nbytes": len(data),
            "sha256": digest,
            "extra": extra or {},
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        yield b"".join((MAGIC, struct.pack("<I", len(head)), head, data[i * max_chunk : (i + 1) * max_chunk]))


def parse_frame(frame: bytes, max_frame: int = 64 * 1024 * 1024) -> tuple[FrameHeader, memoryview]:
    """Split and validate one frame; raises :class:`ProtocolError` naming the problem."""
    if len(frame) > max_frame:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the {max_frame}-byte limit")
    if len(frame) < 8 or frame[:4] != MAGIC:
        raise ProtocolError("not a covey frame (bad magic or truncated before the header)")
    (head_len,) = struct.unpack("<I", frame[4:8])
    if head_len > MAX_HEADER or 8 + head_len > len(frame):
        raise ProtocolError(f"frame header length {head_len} does not fit the {len(frame)}-byte frame (truncated)")
    try:
        raw = json.loads(frame[8 : 8 + head_len].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ProtocolError("frame header is not UTF-8 JSON") from None
    try:
        header = FrameHeader(
            kind=str(raw["kind"]),
            run=str(raw["run"]),
            round=int(raw["round"]),
            group=int(raw["group"]),
            sender=str(raw["sender"]),
            msg_id=str(raw["msg_id"]),
            chunk=int(raw["chunk"]),
            n_chunks=int(raw["n_chunks"]),
            dtype=str(raw["dtype"]),
            shape=tuple(int(d) for d in raw["shape"]),
            nbytes=int(raw["nbytes"]),
            sha256=str(raw["sha256"]),
            extra=dict(raw.get("extra") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"frame header is missing or has a bad field ({exc})") from None
    if header.kind not in FRAME_KINDS:
        raise ProtocolError(f"unknown frame kind {header.kind!r}")
    if header.dtype not in DTYPES:
        raise ProtocolError(f"frame dtype {header.dtype!r} is not float32 or uint8")
    if not 0 <= header.chunk < header.n_chunks or header.n_chunks > 100_000:
        raise ProtocolError(f"chunk {header.chunk} of {header.n_chunks} is out of range")
    item = np.dtype(DTYPES[header.dtype]).itemsize
    if any(d < 0 for d in header.shape) or math.prod(header.shape) * item != header.nbytes:
        raise ProtocolError(f"shape {header.shape} of {header.dtype} does not hold {header.nbytes} bytes")
    return header, memoryview(frame)[8 + head_len :]  # the payload chunk, not copied


class Reassembler:
    """Collects chunks by message id; returns the checked payload when complete.

    Memory is bounded by bytes, not by a count of messages: a payload larger than
    ``max_bytes`` is refused, and the partial messages together may announce at most
    ``max_pending_bytes``; a new message that does not fit evicts the oldest partial
    ones (logged and counted in ``evicted``). A device expects a model or two at a
    time; the coordinator receives one model per device of a parallel round at once
    (50 devices x 26 MB interleaved on one topic), so it passes a bound that fits them
    all. A fixed count of 16 partial messages once silently lost a 50-device round.
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, max_pending_bytes: int = 1024 * 1024 * 1024) -> None:
        self.max_bytes, self.max_pending_bytes = max_bytes, max_pending_bytes
        self._parts: dict[str, tuple[FrameHeader, dict[int, memoryview], float]] = {}
        self.evicted = 0

    @property
    def pending_bytes(self) -> int:
        return sum(h.nbytes for h, _, _ in self._parts.values())

    def _make_room(self, nbytes: int) -> None:
        pending = self.pending_bytes
        while self._parts and pending + nbytes > self.max_pending_bytes:
            oldest = min(self._parts, key=lambda k: self._parts[k][2])
            head, parts, _ = self._parts.pop(oldest)
            pending -= head.nbytes
            self.evicted += 1
            log.warning(
                "evicted the partial %s frame %s from %s (%d of %d chunks): more than %d MB of partial payloads",
                head.kind,
                oldest,
                head.sender,
                len(parts),
                head.n_chunks,
                self.max_pending_bytes // 2**20,
            )

    def add(self, frame: bytes) -> Payload | None:
        header, chunk = parse_frame(frame)
        if header.nbytes > self.max_bytes:
            raise ProtocolError(f"payload of {header.nbytes} bytes exceeds the {self.max_bytes}-byte limit")
        if header.n_chunks == 1 and len(chunk) != header.nbytes:
            raise ProtocolError(f"frame carries {len(chunk)} payload bytes, header says {header.nbytes} (truncated?)")
        if header.n_chunks > 1 and header.msg_id not in self._parts:
            self._make_room(header.nbytes)
        first, parts, _ = self._parts.get(header.msg_id, (header, {}, time.monotonic()))
        if (first.sha256, first.n_chunks, first.nbytes) != (header.sha256, header.n_chunks, header.nbytes):
            self._parts.pop(header.msg_id, None)
            raise ProtocolError(f"chunks of message {header.msg_id} disagree about the payload")
        parts[header.chunk] = chunk
        self._parts[header.msg_id] = (first, parts, time.monotonic())
        if len(parts) < header.n_chunks:
            return None
        self._parts.pop(header.msg_id, None)
        data = parts[0] if header.n_chunks == 1 else memoryview(b"".join(parts[i] for i in range(header.n_chunks)))
        if len(data) != header.nbytes:
            raise ProtocolError(f"reassembled {len(data)} bytes, header says {header.nbytes} (truncated chunk)")
        if hashlib.sha256(data).hexdigest() != header.sha256:
            raise ProtocolError(f"payload sha256 mismatch for message {header.msg_id}: corrupted in transit")
        array = np.frombuffer(data, dtype=np.dtype(DTYPES[header.dtype]).newbyteorder("<")).reshape(header.shape)
        return Payload(first, array.astype(DTYPES[header.dtype], copy=False))


def check_weights(payload: Payload, n_params: int) -> np.ndarray:
    """A model payload must be a finite float32 vector of the model's length."""
    arr = payload.array
    if payload.header.dtype != "float32" or arr.ndim != 1:
        raise ProtocolError(f"weights must be a 1-D float32 vector, got {payload.header.dtype} {arr.shape}")
    if arr.shape[0] != n_params:
        raise ProtocolError(f"weights have {arr.shape[0]} values; the model has {n_params}")
    if not np.isfinite(arr).all():
        raise ProtocolError("weights hold NaN or infinite values")
    return arr
