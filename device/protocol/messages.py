"""Control messages: a JSON envelope around one typed body per message type.

Envelope::

    {"type": "train", "run": "site", "sender": "server", "round": 3,
     "body": {...}, "id": "4f1c...", "sent_at": 1795250000.1, "v": 2}

Every body is a frozen dataclass below; :func:`decode_message` validates the envelope
and the body for its type and says what is wrong. ``docs/protocol.md`` explains each
one, and ``docs/protocol.schema.json`` (generated from these classes by
``python -m device.protocol.schema``) is the machine-readable form.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from device.errors import ProtocolError
from device.protocol.boards import Platform, Telemetry
from device.protocol.codecs import FrameCodec
from device.protocol.typed import Above, AtLeast, Identifier, MaxLen, from_body, read_value, to_body

PROTOCOL_VERSION = 2
MAX_MESSAGE_BYTES = 1_000_000
# the most samples a device may claim: beyond, sample-weighted sums overflow floats
# (one registration claiming 10**300 samples ended the run it joined)
MAX_SAMPLES = 2**31 - 1

TaskId = Annotated[str, Identifier("task id")]
DeviceId = Annotated[str, Identifier("device id")]
ModelKeys = Annotated[tuple[Annotated[str, Identifier("model key")], ...], MaxLen(64)]
Count = Annotated[int, AtLeast(0)]
ClassCounts = Annotated[tuple[Count, ...], AtLeast(1), MaxLen(100_000)]
GroupMode = Literal["chain", "parallel"]
Split = Literal["train", "test"]


class ProtocolVersionError(ProtocolError):
    """A message of another protocol version (``version`` says which)."""

    def __init__(self, version: object) -> None:
        super().__init__(f"protocol version {version!r} is not {PROTOCOL_VERSION}")
        self.version = version


def _plausible(**counts: int) -> None:
    for name, value in counts.items():
        if value > MAX_SAMPLES:
            raise ValueError(f"{name} exceeds {MAX_SAMPLES}: no device holds that many samples")


# -- device -> server ----------------------------------------------------------------------
@dataclass(frozen=True)
class InboundTransfer:
    """How fast the model a task trained from arrived (``device/protocol/frames.py``,
    ``TransferTiming``): from ``source`` (``"server"`` or the predecessor that handed it
    on), ``nbytes`` of every chunk after the first in ``seconds`` between the first
    chunk's arrival and the last's. The coordinator turns it into a measured goodput of
    that path (``server/links.py``, entries marked ``transfer``)."""

    source: Annotated[str, Identifier("transfer source")]
    nbytes: Annotated[int, AtLeast(1)]
    seconds: Annotated[float, Above(0)]

    def __post_init__(self) -> None:
        if self.nbytes > 2**31 or self.seconds > 3600:
            raise ValueError(f"{self.nbytes} bytes in {self.seconds} s is not a model transfer")
        if not 0 < 8.0 * self.nbytes / self.seconds <= 1e12:
            raise ValueError(f"{self.nbytes} bytes in {self.seconds} s is not between 0 and 1e12 bit/s")


@dataclass(frozen=True)
class Register:
    """A device announces itself once it holds the model, and again whenever the
    server's epoch changes (registering twice is fine: the later one wins).
    ``class_counts`` has one count per class of the model and sums to ``n_samples``.
    ``codecs``: the frame codecs the agent decodes and sends (``device/protocol/codecs.py``);
    absent from agents older than ``int4``, which know ``raw``, ``fp16``, ``int8`` and
    ``int8z``. Names the receiver does not know are kept as they are, not refused.
    ``platform``: what the board is (``device/protocol/boards.py``); absent from agents
    older than it."""

    n_samples: Annotated[int, AtLeast(1)]
    n_test: Count
    class_counts: ClassCounts
    runtime: Annotated[str, MaxLen(64)]
    memory_mb: Count
    direct: bool = True
    model_sha256: str | None = None
    codecs: Annotated[tuple[Annotated[str, MaxLen(16)], ...], MaxLen(32)] | None = None
    platform: Platform | None = None

    def __post_init__(self) -> None:
        if sum(self.class_counts) != self.n_samples:
            raise ValueError(f"class_counts sum to {sum(self.class_counts)}, but n_samples is {self.n_samples}")
        _plausible(n_samples=self.n_samples, n_test=self.n_test)


@dataclass(frozen=True)
class TrainResult:
    """After a ``train`` request, sent right after the output frames. ``loss`` is the
    sample-weighted mean of the mini-batch losses over all local steps. ``telemetry``:
    how the task went on the board (peak memory, temperature; ``device/protocol/boards.py``)."""

    task_id: TaskId
    n_samples: Count
    loss: float
    steps: Count
    group: Count
    position: Count
    class_counts: ClassCounts
    train_seconds: Annotated[float, AtLeast(0)] = 0.0
    deliver_seconds: Annotated[float, AtLeast(0)] = 0.0
    inbound: InboundTransfer | None = None  # the start model's arrival, when it came in two or more chunks
    telemetry: Telemetry | None = None
    kind: Literal["train"] = "train"

    def __post_init__(self) -> None:
        _plausible(n_samples=self.n_samples, class_counts=sum(self.class_counts))


@dataclass(frozen=True)
class PretrainResult:
    """After a ``pretrain`` request, sent right after the ``update`` frame."""

    task_id: TaskId
    n_samples: Count
    loss: float
    steps: Count
    kind: Literal["pretrain"] = "pretrain"

    def __post_init__(self) -> None:
        _plausible(n_samples=self.n_samples)


@dataclass(frozen=True)
class EvalRow:
    """One evaluated model: ``loss`` is the mean per-sample cross-entropy over the whole
    split, ``correct`` the number of samples whose arg-max is the label, ``n`` the
    split's size."""

    index: Count
    loss: float
    correct: Count
    n: Count

    def __post_init__(self) -> None:
        _plausible(n=self.n)
        if self.correct > self.n:
            raise ValueError(f"{self.correct} correct of {self.n} samples")
        if self.loss < 0:
            raise ValueError(f"a cross-entropy loss is never negative, got {self.loss}")


@dataclass(frozen=True)
class EvaluateResult:
    """After an ``evaluate`` request: one row per model index."""

    task_id: TaskId
    evaluations: Annotated[tuple[EvalRow, ...], MaxLen(64)]
    kind: Literal["evaluate"] = "evaluate"


Result = Union[TrainResult, PretrainResult, EvaluateResult]  # noqa: UP007 (a runtime union for typed.py)


@dataclass(frozen=True)
class Pong:
    """Reply to ``ping``: ``echo`` is the ping's ``t``."""

    echo: float


FailureReason = Literal["diverged", "error"]


@dataclass(frozen=True)
class TrainFailed:
    """Device to server: the train request ``task_id`` cannot be done. ``reason``:
    ``diverged`` (training left NaN or infinite weights: the device sends no model) or
    ``error`` (anything else it cannot recover from); ``detail`` for the log. The group
    manager goes on without the device at once instead of waiting for its deadline (a
    chain from the device's input), and does not credit it."""

    task_id: TaskId
    reason: FailureReason
    detail: Annotated[str, MaxLen(300)] = ""


# -- server -> device -----------------------------------------------------------------------
@dataclass(frozen=True)
class LocalTraining:
    """Local SGD settings: ``epochs`` passes over the data in shuffled mini-batches of
    ``batch`` (the last, partial batch included), learning rate ``lr``, FedProx
    proximal weight ``mu`` (0: plain SGD), stopping after ``max_steps`` steps if set."""

    epochs: Annotated[int, AtLeast(1)]
    batch: Annotated[int, AtLeast(1)]
    lr: Annotated[float, Above(0)]
    mu: Annotated[float, AtLeast(0)] = 0.0
    max_steps: Annotated[int, AtLeast(1)] | None = None


@dataclass(frozen=True)
class DeviceHop:
    """Send the output straight to the successor device (direct hand-off)."""

    device: DeviceId
    task_id: TaskId
    to: Literal["device"] = "device"


@dataclass(frozen=True)
class ManagerHop:
    """Send the output to the group manager (relay, chain end, parallel member)."""

    group: Count
    to: Literal["group"] = "group"


Hop = Union[DeviceHop, ManagerHop]  # noqa: UP007


@dataclass(frozen=True)
class TrainRequest:
    """Train from the model that arrives for ``task_id`` and send the output to ``next``.

    The model comes from the server (``predecessor`` = ``"server"``, on
    ``device/<id>/frames`` or as the shared key in ``shared``) or, with direct
    hand-offs, from the predecessor device on ``device/<id>/frames/from/<predecessor>``
    (the server may also send it when the predecessor was skipped). ``codec``: how to
    send the output (``device/protocol/codecs.py``); an ``int8`` (``int4``) output is a
    delta against the model that arrived for this task. ``discard_start``: the server will
    never send a start model as a delta against this one (runs other than ``int8`` and
    ``int4``, ``server/downlink.py``), so the device need not keep it and may train into
    its buffer (``TFLiteModel.train(reuse_start=True)``), one model less at its memory
    peak. Absent (a coordinator that predates it): the device keeps it, which is safe."""

    task_id: TaskId
    group: Count
    position: Count
    mode: GroupMode
    predecessor: DeviceId
    next: Hop
    train: LocalTraining
    seed: Count
    shared: ModelKeys = ()
    codec: FrameCodec = "raw"
    discard_start: bool = False


@dataclass(frozen=True)
class PretrainRequest:
    """Train ``steps`` mini-batch SGD steps from the model that arrives (cold start) and
    reply with one ``update`` frame holding trained minus start weights, then a
    ``result`` message of kind ``pretrain``."""

    task_id: TaskId
    steps: Annotated[int, AtLeast(1)]
    batch: Annotated[int, AtLeast(1)]
    lr: Annotated[float, Above(0)]
    seed: Count
    shared: ModelKeys = ()


@dataclass(frozen=True)
class EvaluateRequest:
    """Evaluate ``n_models`` models (frames with ``extra.index`` 0..n-1, or the
    ``shared`` keys in order) on the ``split`` and reply with one ``result``."""

    task_id: TaskId
    n_models: Annotated[int, AtLeast(1)]
    split: Split
    shared: ModelKeys = ()

    def __post_init__(self) -> None:
        if self.n_models > 64:
            raise ValueError("at most 64 models per evaluate request")
        if self.shared and len(self.shared) != self.n_models:
            raise ValueError(f"{len(self.shared)} shared keys for {self.n_models} models")


@dataclass(frozen=True)
class ResendRequest:
    """Send the output of ``task_id`` (the device's last output) again, to ``to``."""

    task_id: TaskId
    to: Hop


@dataclass(frozen=True)
class Ping:
    """Answer with ``pong`` echoing ``t`` (the server's clock)."""

    t: float


@dataclass(frozen=True)
class Listen:
    """Server to device: take direct frames from ``peers`` (link probes, and their echoes)
    for the next ``seconds``. A device subscribes to a peer's hand-off topic only while a
    ``train`` request names that peer as its predecessor or a ``listen`` names it, so a
    device that no round and no measurement pairs with it cannot reach it at all (the
    broker delivers a frame only to a subscriber). The coordinator sends one before it
    measures links: each device hears the peers it probes and those that probe it."""

    peers: Annotated[tuple[DeviceId, ...], MaxLen(512)]
    seconds: Annotated[float, Above(0)]

    def __post_init__(self) -> None:
        if self.seconds > 3600:
            raise ValueError(f"seconds must be at most 3600, got {self.seconds}")


@dataclass(frozen=True)
class Stop:
    """Leave the run; ``reason`` says why (shown in the device's log)."""

    reason: str = ""


@dataclass(frozen=True)
class Assignment:
    """Retained on ``device/<id>/assignment``: the device's group this round (-1: none)."""

    group: Annotated[int, AtLeast(-1)]


@dataclass(frozen=True)
class ServerStatus:
    """Retained on ``server/status``: the coordinator's state and epoch. A new epoch
    means a new coordinator process: devices register again."""

    epoch: Annotated[str, Identifier("epoch")]
    state: Literal["running", "stopped"]
    protocol: int = PROTOCOL_VERSION
    model_sha256: str | None = None


@dataclass(frozen=True)
class Ack:
    """The server holds these results: the device may forget them."""

    task_ids: Annotated[tuple[TaskId, ...], MaxLen(1000)]


# -- link measurement (docs/links.md) ------------------------------------------------------
MAX_PROBE_BYTES = 4 * 2**20
ProbeTarget = Annotated[str, Identifier("probe target")]  # "server" or a device id


@dataclass(frozen=True)
class LinkProbeRequest:
    """Server to device: measure the path to the server and to each of ``peers``.

    Per target, ``probes`` empty probe frames (RTT: median and interquartile range)
    and, with ``payload_bytes`` > 0, one probe of that many bytes (goodput: its bytes
    over its round-trip time). A probe not echoed within ``timeout_s`` counts
    as lost. Probes travel the way models do: to the server on the device's frames
    topic, to a peer on the direct hand-off topic."""

    task_id: TaskId
    peers: Annotated[tuple[DeviceId, ...], MaxLen(256)] = ()
    probes: Annotated[int, AtLeast(1)] = 3
    payload_bytes: Annotated[int, AtLeast(0)] = 256 * 1024
    timeout_s: Annotated[float, Above(0)] = 5.0

    def __post_init__(self) -> None:
        if self.probes > 16:
            raise ValueError(f"probes must be at most 16, got {self.probes}")
        if self.payload_bytes > MAX_PROBE_BYTES:
            raise ValueError(f"payload_bytes must be at most {MAX_PROBE_BYTES}, got {self.payload_bytes}")
        if self.timeout_s > 60:
            raise ValueError(f"timeout_s must be at most 60, got {self.timeout_s}")


@dataclass(frozen=True)
class PathReport:
    """What one path measured; ``None``: not measured (every probe lost, or no goodput probe)."""

    target: ProbeTarget
    sent: Count
    answered: Count
    rtt_ms: float | None = None  # median
    rtt_spread_ms: float | None = None  # interquartile range
    goodput_bps: float | None = None  # payload bits per second of the goodput probe

    def __post_init__(self) -> None:
        if self.answered > self.sent or self.sent > 32:
            raise ValueError(f"{self.target}: {self.answered} of {self.sent} probes answered is impossible")
        for name in ("rtt_ms", "rtt_spread_ms"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 600_000:
                raise ValueError(f"{self.target}: {name} {value} is not between 0 and 600000 ms")
        if self.goodput_bps is not None and not 0 < self.goodput_bps <= 1e12:
            raise ValueError(f"{self.target}: goodput {self.goodput_bps} bit/s is not between 0 and 1e12")


@dataclass(frozen=True)
class WifiInfo:
    """The device's Wi-Fi as its platform reports it (``device/link.py``)."""

    interface: Annotated[str, MaxLen(32)]
    source: Literal["/proc/net/wireless", "iw", "termux"]
    signal_dbm: float | None = None
    noise_dbm: float | None = None

    def __post_init__(self) -> None:
        for name in ("signal_dbm", "noise_dbm"):
            value = getattr(self, name)
            if value is not None and not -150 <= value <= 30:
                raise ValueError(f"Wi-Fi {name} {value} is not a level between -150 and 30 dBm")

    @property
    def snr_db(self) -> float | None:
        """Signal over noise, where the platform reports both."""
        if self.signal_dbm is None or self.noise_dbm is None:
            return None
        return self.signal_dbm - self.noise_dbm


@dataclass(frozen=True)
class LinkReport:
    """Device to server: the answer to a :class:`LinkProbeRequest`."""

    task_id: TaskId
    paths: Annotated[tuple[PathReport, ...], MaxLen(257)]
    wifi: WifiInfo | None = None


BODY_TYPES: dict[str, Any] = {
    "register": Register,
    "result": Result,
    "pong": Pong,
    "failed": TrainFailed,
    "train": TrainRequest,
    "pretrain": PretrainRequest,
    "evaluate": EvaluateRequest,
    "resend": ResendRequest,
    "ping": Ping,
    "listen": Listen,
    "stop": Stop,
    "assignment": Assignment,
    "status": ServerStatus,
    "ack": Ack,
    "link_probe": LinkProbeRequest,
    "link_report": LinkReport,
}
MessageType = Literal[
    "register",
    "result",
    "pong",
    "failed",
    "train",
    "pretrain",
    "evaluate",
    "resend",
    "ping",
    "listen",
    "stop",
    "assignment",
    "status",
    "ack",
    "link_probe",
    "link_report",
]
MESSAGE_TYPES: tuple[str, ...] = tuple(BODY_TYPES)
_TYPE_OF: dict[type, str] = {cls: name for name, cls in BODY_TYPES.items() if isinstance(cls, type)} | {
    TrainResult: "result",
    PretrainResult: "result",
    EvaluateResult: "result",
}


@dataclass(frozen=True)
class Message:
    """A typed, versioned control message (JSON on the wire)."""

    type: MessageType
    run: str
    sender: str
    round: int
    body: Any
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    sent_at: float = field(default_factory=time.time)
    v: int = PROTOCOL_VERSION

    @classmethod
    def of(cls, body: Any, *, run: str, sender: str, round: int = 0) -> Message:
        """The message carrying ``body`` (its type follows from the body's class)."""
        kind = _TYPE_OF.get(type(body))
        if kind is None:
            raise ProtocolError(f"{type(body).__name__} is not a message body")
        return cls(kind, run, sender, int(round), body)  # type: ignore[arg-type]

    def encode(self) -> bytes:
        raw = {
            "type": self.type,
            "run": self.run,
            "sender": self.sender,
            "round": self.round,
            "body": to_body(self.body),
            "id": self.id,
            "sent_at": self.sent_at,
            "v": self.v,
        }
        return json.dumps(raw, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class Envelope:
    """The envelope fields (every one required)."""

    type: str
    run: Annotated[str, Identifier("run id")]
    sender: Annotated[str, Identifier("sender")]
    round: Count
    body: dict[str, Any]
    id: Annotated[str, Identifier("message id")]
    sent_at: float
    v: int


def decode_message(data: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Parse and validate a control message and its body; :class:`ProtocolError` says
    what is wrong (:class:`ProtocolVersionError` for another protocol version)."""
    if len(data) > max_bytes:
        raise ProtocolError(f"control message of {len(data)} bytes exceeds {max_bytes}")
    if data[:3] == b"CVY":
        raise ProtocolError("a binary frame arrived where a control message was expected")
    try:
        raw = json.loads(data.decode())
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer of > 4300 digits, too deep
        raise ProtocolError(f"control message is not UTF-8 JSON ({str(exc)[:80]})") from None
    if not isinstance(raw, dict):
        raise ProtocolError("control message must be a JSON object")
    if raw.get("v") != PROTOCOL_VERSION:
        raise ProtocolVersionError(raw.get("v"))
    env = from_body(Envelope, raw, "message")
    body_type = BODY_TYPES.get(env.type)
    if body_type is None:
        raise ProtocolError(f"unknown message type {env.type!r}")
    body = read_value(body_type, env.body, f"{env.type}.body")
    return Message(env.type, env.run, env.sender, env.round, body, env.id, env.sent_at, env.v)  # type: ignore[arg-type]


def legacy_stop(run: str, reason: str, version: int = 1) -> bytes:
    """A ``stop`` in an older protocol's envelope, so that an out-of-date agent, which
    cannot read version-2 messages, still leaves the run (and its log says why)."""
    raw = {
        "type": "stop",
        "run": run,
        "sender": "server",
        "round": 0,
        "body": {"reason": reason},
        "id": uuid.uuid4().hex[:16],
        "sent_at": time.time(),
        "v": version,
    }
    return json.dumps(raw, separators=(",", ":")).encode()
