"""What the coordinator and a site's edge say to each other (issue 28).

The coordinator hands an edge a group whose members all sit behind it
(:class:`EdgeTask` on ``covey/<run>/edge/<name>/tasks``, the group's start model as
frames on ``.../edge/<name>/models`` unless the edge already holds it); the edge runs
the group's manager over its own broker and answers with :class:`EdgeReport` on its
``from/edge.<name>/results`` topic, the group's one model (a chain's last model, or a
``mean_only`` parallel group's sample-weighted mean) as ``result`` frames on
``from/edge.<name>/frames``. Both travel over the edge's bridge, so the central ACL
decides who may say what: an edge writes only its own ``from/edge.<name>/`` topics and
reads only its own ``edge/<name>/`` ones.

These messages are JSON like the device protocol's, with their own envelope: they are
not part of what a device speaks (``docs/protocol.md``), and a board never sees them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from device.errors import ProtocolError
from device.protocol import LocalTraining
from device.protocol.typed import AtLeast, Identifier, MaxLen, from_body, to_body

EDGE_PROTOCOL = 1
MAX_EDGE_MESSAGE_BYTES = 1 << 20
EdgeId = Annotated[str, Identifier("device id")]


def task_key(prefix: str, round_: int, group_id: int) -> str:
    """A group's task at an edge: its members' task ids start with it
    (``<prefix>-r<round>-g<group>-p<i>``, :class:`~server.execution.manager.GroupManager`)."""
    return f"{prefix}-r{round_}-g{group_id}"


@dataclass(frozen=True)
class HopLimits:
    """A chain's hand-off bound (:class:`~server.hops.HopBound`); ``reference`` None: none known."""

    reference: float | None
    norm_factor: float | None
    clip_factor: float | None


@dataclass(frozen=True)
class EdgeTask:
    """Run group ``group_id`` of round ``round`` over the edge's broker.

    ``task_prefix`` is the coordinator's for this plan, so each member's task id is the
    one the coordinator would have used (acknowledged after its checkpoint as usual);
    ``model`` the sha256 of the start model's float32 bytes; ``rule`` how a parallel
    group's members' models become the one model sent up
    (:data:`~server.strategies.base.GroupRule`); ``codec`` the run's, in which that model
    goes up (:mod:`server.edge.uplink`)."""

    round: Annotated[int, AtLeast(1)]
    group_id: Annotated[int, AtLeast(0)]
    members: Annotated[tuple[EdgeId, ...], AtLeast(1), MaxLen(100_000)]
    mode: Literal["chain", "parallel"]
    task_prefix: Annotated[str, Identifier("task prefix")]
    train: LocalTraining
    deadline_s: Annotated[float, AtLeast(0.1)]
    seed: int
    max_chunk: Annotated[int, AtLeast(1024)]
    handoff: Literal["direct", "relay"]
    model: Annotated[str, MaxLen(64)]
    hop: HopLimits | None = None
    rule: Literal["sample_mean", "dsc_angle"] = "sample_mean"  # a parallel group's one model (GroupRule)
    codec: Literal["fp32", "fp16", "int8", "int4"] = "fp32"  # the run's: how that model goes up (WireCodec)

    @property
    def key(self) -> str:
        return task_key(self.task_prefix, self.round, self.group_id)


@dataclass(frozen=True)
class EdgeMember:
    """A member that trained: the samples and loss it reported to the edge."""

    device: EdgeId
    n_samples: Annotated[int, AtLeast(0)]
    loss: float


@dataclass(frozen=True)
class EdgeReport:
    """What became of a task. ``status`` ``done``: the members that trained, those
    skipped and refused, and the sha256 of the group model the edge sent as frames
    (None: nobody's model came back); ``missing_model``: the edge does not hold the start
    model ``model`` (it restarted): send it."""

    round: Annotated[int, AtLeast(1)]
    group_id: Annotated[int, AtLeast(0)]
    task_prefix: Annotated[str, Identifier("task prefix")]
    status: Literal["done", "missing_model"]
    members: Annotated[tuple[EdgeMember, ...], MaxLen(100_000)] = ()
    skipped: Annotated[tuple[EdgeId, ...], MaxLen(100_000)] = ()
    refused: Annotated[tuple[EdgeId, ...], MaxLen(100_000)] = ()
    model: Annotated[str, MaxLen(64)] | None = None

    @property
    def key(self) -> str:
        return task_key(self.task_prefix, self.round, self.group_id)


_TYPES: dict[str, type[Any]] = {"edge_task": EdgeTask, "edge_report": EdgeReport}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode_edge(body: EdgeTask | EdgeReport, run: str) -> bytes:
    raw = {"covey_edge": EDGE_PROTOCOL, "type": _NAMES[type(body)], "run": run, "body": to_body(body)}
    return json.dumps(raw, separators=(",", ":"), allow_nan=False).encode()


def decode_edge(data: bytes, run: str) -> EdgeTask | EdgeReport:
    """Parse and check one edge message of ``run``; :class:`ProtocolError` says what is wrong."""
    if len(data) > MAX_EDGE_MESSAGE_BYTES:
        raise ProtocolError(f"edge message of {len(data)} bytes exceeds {MAX_EDGE_MESSAGE_BYTES}")
    try:
        raw = json.loads(data.decode())
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"edge message is not UTF-8 JSON ({str(exc)[:80]})") from None
    if not isinstance(raw, dict) or raw.get("covey_edge") != EDGE_PROTOCOL:
        raise ProtocolError(f"not an edge message of protocol {EDGE_PROTOCOL}")
    if raw.get("run") != run:
        raise ProtocolError(f"edge message for run {raw.get('run')!r}, not {run!r}")
    cls = _TYPES.get(raw.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown edge message type {raw.get('type')!r}")
    body = from_body(cls, raw.get("body"), where=str(raw.get("type")))
    if isinstance(body, EdgeReport) and any(not math.isfinite(m.loss) for m in body.members):
        raise ProtocolError("edge report with a non-finite loss")
    return body
