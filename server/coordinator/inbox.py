"""What devices send the coordinator, checked and handed to whoever waits for it.

:class:`Inbox` takes one message at a time from the bus (:meth:`Inbox.pump`), with
the sender the broker reports (the device named by the topic, ``from/<id>/...``; a
payload that claims anyone else is dropped), and routes it: registrations and pongs
to the registry, link reports and probe frames to the link prober, training results
and their frames to the round's execution, pre-training and evaluation replies to
the requests. Whatever is wrong is dropped with a log line and counted in the round's
record (by reason, and per registered device); no single message, from anyone, stops
a run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from device.errors import CoveyError, ProtocolError
from device.mqtt import Incoming
from device.probing import send_probe_frame
from device.protocol import (
    SERVER_ID,
    InboundTransfer,
    LinkReport,
    Message,
    Payload,
    Ping,
    Pong,
    Publish,
    Register,
    Stop,
    Topics,
    TrainFailed,
    TrainResult,
    WireCodec,
    check_weights,
)
from server.coordinator.bus import DeviceBus
from server.coordinator.prober import LinkProber
from server.coordinator.registry import DeviceRecord, Registry
from server.coordinator.requests import TaskRequests
from server.coordinator.retained import RetainedJunk
from server.edge.messages import decode_edge
from server.edge.proxy import EDGE_PREFIX, EdgeBook
from server.execution.round import RoundExecution
from server.strategies.base import ClientInfo

log = logging.getLogger("covey.server")


class OtherRoundError(ProtocolError):
    """A result of another round than the current one: dropped quietly (a device
    delivering a held result again is honest), and its message id not remembered."""

    reason = "result of another round"


@dataclass(frozen=True)
class InboxSettings:
    """What the inbox checks messages against."""

    run: str
    codec: WireCodec  # a device that cannot decode the run's codec is told to update
    n_classes: int
    n_params: int  # no payload of the run is larger than one float32 model of this size


class Inbox:
    """Routes each message from the devices (see the module docstring).

    Parameters
    ----------
    settings : the run's id, codec and model size.
    topics, publish : the run's topics, and how to answer (pings, echoes, stops).
    bus : where messages come from (identity, reassembly, de-duplication, drops).
    registry, prober, execution, requests, retained : who handles what arrives.
    bases : this round's start models by payload sha256 (what int8 deltas may name).
    current_round : the round being run (results of others are not this round's).
    on_client : a device passed admission or registered new counts.
    edges : the site's edges (their status, reports and group models), or None.
    """

    def __init__(
        self,
        settings: InboxSettings,
        *,
        topics: Topics,
        publish: Publish,
        bus: DeviceBus,
        registry: Registry,
        prober: LinkProber,
        execution: RoundExecution,
        requests: TaskRequests,
        retained: RetainedJunk,
        bases: dict[str, np.ndarray],
        current_round: Callable[[], int],
        on_client: Callable[[ClientInfo], None],
        edges: EdgeBook | None = None,
    ) -> None:
        self.settings, self.topics, self.publish, self.bus = settings, topics, publish, bus
        self.registry, self.prober, self.execution = registry, prober, execution
        self.requests, self.retained, self.bases = requests, retained, bases
        self.current_round, self.on_client = current_round, on_client
        self.edges = edges
        # what happened to the run itself, for people (results.json's run_events, the
        # dashboard): one list with the requests', which note the devices that did not answer
        self.run_events: list[dict[str, object]] = requests.run_events

    def drop(self, reason: str, detail: str, device: str | None = None, quiet: bool = False) -> None:
        """Count (by reason, and per registered ``device``) and log what covey did not use."""
        self.bus.drops.drop(reason, detail, device, quiet)

    def pump(self, timeout: float) -> None:
        """Handle one incoming message (if any arrives within ``timeout``)."""
        if self.bus.reconnected():  # back after losing the broker
            log.warning("connection to the broker is back; sending this round's outstanding work again")
            self.execution.resend_outstanding()
            self.run_events.append(
                {"round": self.current_round(), "kind": "reconnected", "detail": "outstanding work sent again"}
            )
        run = self.settings.run
        for device, t in self.registry.pings_due():  # admission: confirm new devices
            self.publish(self.topics.inbox(device), Message.of(Ping(t), run=run, sender=SERVER_ID).encode(), False)
        item = self.bus.receive(timeout)
        if item is None:
            return
        try:
            self._dispatch(item)
        except OtherRoundError as exc:  # not held against the device (_on_result)
            self.drop(exc.reason, f"{item.topic}: {exc}", quiet=True)
        except CoveyError as exc:
            self.drop(getattr(exc, "reason", type(exc).__name__), f"{item.topic}: {exc}", self.bus.sender(item))
        except Exception as exc:  # no single message, from anyone, may stop a run
            log.exception("unexpected error handling %s", item.topic)
            self.drop(f"unexpected {type(exc).__name__}", f"{item.topic}: {exc}", self.bus.sender(item))

    def _dispatch(self, item: Incoming) -> None:
        who = self.topics.device_of(item.topic)
        if self.retained.handles(item, *(who or (None, None))):
            return
        if who is None:
            if item.topic == f"{self.topics.root}/server/register":
                self.registry.legacy_register(item.payload, self.publish, self.topics)
                return
            raise ProtocolError(f"unexpected topic {item.topic}")
        device, kind = who
        if device.startswith(EDGE_PREFIX):
            self._on_edge(device, kind, item)
            return
        if kind == "status":
            self.registry.set_status(device, item.payload)
            return
        if kind == "frames":
            self.registry.known(device)  # nothing from an unregistered id is held while it reassembles
            payload = self.bus.reassemble(device, item)
            if payload is not None:
                self._on_frame(device, payload)
            return
        msg = self.bus.decode_once(device, item)
        if msg is None:
            return
        self._on_message(device, kind, msg)
        self.bus.used(msg)

    def _on_edge(self, user: str, kind: str, item: Incoming) -> None:
        """What a site's edge sends (its bridge's user writes only its own topics): its
        status, its groups' reports and their models (server/edge/proxy.py)."""
        if self.edges is None:
            raise ProtocolError(f"{user} writes as an edge, and this run has none")
        if kind == "status":
            self.edges.on_status(user, item.payload)
            return
        if kind == "frames":
            payload = self.bus.reassemble(user, item)
            if payload is None:
                return
            weights = check_weights(payload, self.settings.n_params, self.bases)  # int8: against its start
            body: object = payload.header
            size = int(payload.array.nbytes)
        elif kind == "results":
            body, weights, size = decode_edge(item.payload, self.settings.run), None, 0
        else:
            raise ProtocolError(f"an edge sends no {kind} messages")
        outcome = self.execution.on_edge(user, body, weights, size)
        if outcome == "duplicate":
            self.drop("duplicate edge message", f"{user} {type(body).__name__}", quiet=True)
        elif outcome == "unexpected":
            raise ProtocolError(f"{user} sent {type(body).__name__} that no group run there expects")

    def _on_message(self, device: str, kind: str, msg: Message) -> None:
        if msg.sender != device:
            raise ProtocolError(f"message claims sender {msg.sender!r} but came from {device!r}")
        if msg.run != self.settings.run:
            raise ProtocolError(f"message for run {msg.run!r} from {device}")
        if kind == "register":
            if not isinstance(msg.body, Register):
                raise ProtocolError(f"{msg.type!r} on a register topic")
            self._on_register(device, msg.body)
        elif isinstance(msg.body, Pong):
            confirmed = self.registry.pong(device, msg.body)
            self.prober.on_pong(device, msg.body.echo)
            if confirmed is not None:
                self.on_client(confirmed)  # a newcomer passed admission
        elif isinstance(msg.body, LinkReport):
            if not self.prober.book.on_report(device, msg.body):
                raise ProtocolError(f"link report {msg.body.task_id!r} from {device}, which was not asked for it")
        elif isinstance(msg.body, TrainFailed):
            failed = msg.body
            why = f"its training failed ({failed.reason}: {failed.detail or 'no detail'})"
            if not self.execution.on_refused(device, failed.task_id, why):
                raise ProtocolError(f"failure report for task {failed.task_id!r} nobody waits for")
        elif msg.type == "result":
            self._on_result(device, msg)
        else:
            raise ProtocolError(f"{msg.type!r} is not a result")

    def _on_register(self, device: str, body: Register) -> None:
        codec = self.settings.codec
        needs = {"int4", "int4z"} if codec == "int4" else set()  # every version-2 agent knows the rest
        if not needs <= set(body.codecs or ()):
            # an agent from before int4 would drop every int4 request and miss every deadline
            reason = (
                f"this run sends models as {codec} deltas (--codec {codec}) and this agent "
                "does not decode them: update covey on the board, or run the server with --codec int8"
            )
            stop = Message.of(Stop(reason), run=self.settings.run, sender=SERVER_ID)
            self.publish(self.topics.inbox(device), stop.encode(), False)
            raise ProtocolError(f"{device} cannot join: {reason}")
        reg = self.registry.register(device, body)
        for evicted in reg.evicted:
            self.drop("registration evicted before confirming", f"{evicted}: more than the pending limit")
        if reg.changed and reg.info is not None:
            self.on_client(reg.info)  # new counts

    def _on_result(self, device: str, msg: Message) -> None:
        rec = self.registry.known(device)
        body = msg.body
        if not isinstance(body, TrainResult):
            if not self.requests.on_result(device, body):
                raise ProtocolError(f"{body.kind} result from {device} for task {body.task_id!r} nobody waits for")
            return
        current = self.current_round()
        if msg.round != current:
            # a held result delivered again (a reconnect, a new coordinator epoch before the
            # resumed round starts): honest, and asked for again when its round runs, so not
            # counted against the device; raised, so that its id is not remembered (the
            # same message must count when it comes again in its round)
            raise OtherRoundError(f"result of round {msg.round} from {device}; the current round is {current}")
        outcome = self.execution.on_result(device, body)
        if outcome == "duplicate":
            self.drop("duplicate result", f"{device} {body.task_id}", quiet=True)
        elif outcome == "unexpected":
            raise ProtocolError(f"result from {device} for task {body.task_id!r} that no group expects")
        else:
            self._note_counts(rec, body.class_counts)
            self.registry.note_telemetry(device, msg.round, body.telemetry, body.train_seconds)
            if body.inbound is not None:
                self._on_inbound(device, body.task_id, body.inbound)

    def _note_counts(self, rec: DeviceRecord, counts: tuple[int, ...]) -> None:
        """A result's class counts: the device's data may shift (FlexCFL's migration reads
        them), but never beyond the samples it registered, which bound its weight
        (server/claims.py). Other counts are ignored and counted."""
        if len(counts) != self.settings.n_classes or list(counts) == list(rec.info.class_counts):
            return
        if sum(counts) > rec.info.n_samples:
            self.drop("implausible class counts", f"{rec.info.client_id}: {sum(counts)} > {rec.info.n_samples}")
            return
        rec.info = ClientInfo(rec.info.client_id, rec.info.n_samples, np.asarray(counts, np.float64), rec.info.n_test)

    def _on_inbound(self, device: str, task_id: str, inbound: InboundTransfer) -> None:
        """How fast ``device``'s start model reached it: a goodput of the path from the
        server or the task's predecessor (any other source is not counted)."""
        allowed = self.execution.model_sources(device, task_id)
        model_bytes = 4 * self.settings.n_params  # no payload of this run is larger
        why = (
            f"{device} timed {inbound.nbytes} bytes; a model of this run has at most {model_bytes}"
            if inbound.nbytes > model_bytes
            else self.prober.book.add_inbound(device, inbound, allowed)
        )
        if why is not None:
            self.drop("implausible transfer report", why)

    def _on_frame(self, device: str, payload: Payload) -> None:
        self.registry.known(device)
        h = payload.header
        if h.kind == "probe":  # a device measuring its link to the server: answer at once
            send_probe_frame(
                self.publish,
                self.topics.frames(device),
                kind="echo",
                run=self.settings.run,
                sender=SERVER_ID,
                task_id=h.extra.task_id or "",
                index=h.extra.index,
                size=0,
            )
            return
        current = self.current_round()
        try:
            weights = check_weights(payload, self.settings.n_params, self.bases)
        except ProtocolError as exc:
            if h.kind == "result" and h.round == current and h.extra.task_id:
                # a refused output is never coming right: its group goes on without it now
                self.execution.on_refused(device, h.extra.task_id, f"its output was refused ({exc})")
            raise
        if h.kind == "update":
            if not self.requests.on_update(device, h.extra.task_id or "", weights):
                raise ProtocolError(f"update for task {h.extra.task_id!r} nobody waits for")
            self._on_upload(device, payload)
            return
        if h.kind != "result":
            raise ProtocolError(f"devices send result and update frames to the server, not {h.kind!r}")
        if h.round != current:  # as for result messages (_on_result): a held output again
            raise OtherRoundError(f"result frame of round {h.round} from {device}; the current round is {current}")
        outcome = self.execution.on_frame(payload, weights)
        if outcome == "duplicate":
            self.drop("duplicate result", f"{device} frame of {h.extra.task_id}", quiet=True)
        elif outcome == "unexpected":
            raise ProtocolError(f"result frame from {device} that group {h.group} does not expect")
        else:
            self._on_upload(device, payload)

    def _on_upload(self, device: str, payload: Payload) -> None:
        """An expected upload, timed here: the goodput of ``device``'s path to the server."""
        if payload.timing is not None:
            self.prober.book.add_transfer(device, SERVER_ID, payload.timing.nbytes, payload.timing.seconds)
