"""The device agent: fetch the model, register, train, hand on, report.

One loop, one thread of our own (paho's network thread only enqueues). Requests
arrive as typed messages (``device/protocol/messages.py``) on ``device/<id>/inbox``;
models arrive as frames from the server on ``device/<id>/frames``, as shared models
on ``shared/<key>/chunk/<i>``, or from the predecessor on
``device/<id>/frames/from/<predecessor>``. Everything the agent publishes lives under
``from/<id>/``, the topics only this device may write. Every receive is validated
before it acts; what is refused is logged with the reason and counted
(``AgentStats``), and the loop goes on: no single message can stop an agent.

QoS 1 may redeliver a request, so requests are deduplicated by task id and a device
trains at most once per task. The device keeps its finished task ids and its last
output model on disk (``device/state.py``), so a restarted agent resumes and can
still answer a ``resend``. The computation itself is ``device/training.py``, the same
code the simulator runs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device import board
from device.artifact import ArtifactDownload
from device.data import Dataset, class_counts
from device.errors import CoveyError, ModelError, ProtocolError, TransportError, WeightsError
from device.link import read_wifi
from device.mqtt import Incoming, MqttLink, TlsFiles, Will
from device.probing import LinkProber, send_probe_frame
from device.protocol import (
    FRAME_CODECS,
    MAX_PROBE_BYTES,
    PROTOCOL_VERSION,
    SERVER_ID,
    Ack,
    EvaluateRequest,
    FrameHeader,
    LinkProbeRequest,
    Listen,
    Message,
    Ping,
    Pong,
    PretrainRequest,
    ProtocolVersionError,
    Reassembler,
    Register,
    ResendRequest,
    ServerStatus,
    Stop,
    Topics,
    TrainRequest,
    check_id,
    decode_message,
)
from device.runtime import TFLiteModel
from device.state import AgentState
from device.tasks import TaskRunner
from device.transport import Link, LinkFactory
from device.waiting import Ready, Request, WaitingTasks
from device.worker import ModelWorker

log = logging.getLogger("covey.device")

# Per peer (a chain predecessor, a link-probe peer): what its hand-off lane may hold in
# the receive queue before the model is known (then two models' worth, _bound_to_model)
PEER_LANE_MESSAGES = 1_000
PEER_LANE_BYTES = 64 * 2**20
PARTIAL_MAX_AGE_S = 120.0  # a partial payload with no chunk for this long is dropped
# a registration goes again after this long until a request other than a ping comes (a
# ping answered may still be a registration evicted since): a coordinator whose admission
# queue was full when a whole fleet registered at once dropped it unanswered
# (server/coordinator/admission.py), and would otherwise never hear from this device; a
# known device registering again only has its record replaced; the wait doubles each
# time, up to REREGISTER_MAX_S (a board no round samples stays quiet)
REREGISTER_S = 60.0
REREGISTER_MAX_S = 960.0


@dataclass
class AgentConfig:
    device_id: str
    run: str
    host: str
    port: int
    state_dir: Path
    username: str | None = None
    password: str | None = None
    tls: TlsFiles | None = None
    max_chunk: int = 900_000
    threads: int | None = None
    train_priority: str = "idle"  # "idle": interpreter work yields to everything else (device/worker.py)


@dataclass
class AgentStats:
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def queue_full(self, total: int, by_lane: dict[str, int] | None = None) -> None:
        """The link's counts of messages lost to a full receive queue, and to a peer's
        full hand-off lane (``device/mqtt.py``)."""
        if total > self.dropped.get("receive queue full", 0):
            self.dropped["receive queue full"] = total
        for peer, n in list((by_lane or {}).items()):
            self.dropped[f"hand-off lane of {peer} full"] = n


class Agent:
    """A device: local data, a LiteRT model fetched over MQTT, and the request loop."""

    def __init__(
        self,
        config: AgentConfig,
        train: Dataset,
        test: Dataset | None = None,
        *,
        link_factory: LinkFactory = MqttLink,
    ) -> None:
        """``link_factory``: how to reach the broker (:class:`~device.mqtt.MqttLink` on a
        board; an in-process broker's links run the same agent in one process)."""
        check_id(config.device_id)
        self.cfg = config
        self.me = config.device_id
        self.topics = Topics(config.run)
        self.train_data, self.test_data = train, test
        self.stats = AgentStats()
        self.model: TFLiteModel | None = None
        self.runner: TaskRunner | None = None
        self.artifact = ArtifactDownload()
        # before the model is known: generous bounds; once it is, two models' worth
        # (_bound_to_model)
        self._frames = Reassembler(max_pending_bytes=512 * 1024 * 1024, max_pending_per_sender=PEER_LANE_BYTES)
        self._waiting = WaitingTasks()  # requests waiting for their model(s)
        self._shared_subscribed: set[str] = set()
        self._peers_subscribed: set[str] = set()  # peers whose hand-off topic to this device is subscribed
        self._listening: dict[str, float] = {}  # peer -> until when (monotonic) a listen lets it in
        self._server_epoch: str | None = None
        self._unanswered_since: float | None = None  # last registration, until a request comes (REREGISTER_S)
        self._reregister_s = REREGISTER_S
        self.running = True
        self.prober: LinkProber | None = None  # the link-probe request in progress
        self.exit_reason: str | None = None  # set when the server tells the agent to leave for good
        self.worker = ModelWorker(config.train_priority, name=f"covey-model-{config.device_id}")
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.state = AgentState(config.state_dir)
        self.state.load()
        self.link: Link = link_factory(
            f"covey-{config.run}-{config.device_id}",
            config.host,
            config.port,
            username=config.username,
            password=config.password,
            tls=config.tls,
            will=Will(self.topics.status(self.me), b"offline"),
            clean_session=False,
            # each peer's hand-offs are a lane of their own: a peer that floods this device
            # fills its own lane, never the server's requests and models
            lane_of=self._lane_of,
            lane_max_messages=PEER_LANE_MESSAGES,
            lane_max_bytes=PEER_LANE_BYTES,
        )

    # -- connection ------------------------------------------------------------------------
    def start(self, connect_timeout: float = 15.0) -> None:
        self.link.connect(connect_timeout)
        t = self.topics
        # no wildcard over the hand-off topics: a peer is heard only while a request or a
        # listen names it (_sync_peers), so a device no round pairs with cannot flood this one
        self.link.subscribe(
            t.inbox(self.me),
            t.frames(self.me),
            t.artifact_manifest,
            t.artifact_filter,
            t.server_status,
        )
        self.link.publish(t.status(self.me), b"online", retain=True)

    def _register(self) -> None:
        assert self.model is not None
        counts = class_counts(self.train_data.y, self.model.manifest.n_classes)
        body = Register(
            n_samples=len(self.train_data),
            n_test=len(self.test_data) if self.test_data else 0,
            class_counts=tuple(int(c) for c in counts),
            runtime=self.model.backend.name,
            memory_mb=_available_memory_mb(),
            direct=True,
            model_sha256=self.model.manifest.sha256,
            codecs=FRAME_CODECS,
            platform=board.describe(self.model.backend.name, self.model.backend.version),
        )
        self._send(body, 0, self.topics.register(self.me))
        self._unanswered_since = time.monotonic()
        log.info("%s: registered (%d samples)", self.me, body.n_samples)

    def _send(self, body: Any, rnd: int, topic: str | None = None) -> None:
        msg = Message.of(body, run=self.cfg.run, sender=self.me, round=rnd)
        self.link.publish(topic or self.topics.results(self.me), msg.encode())

    def _publish(self, topic: str, data: bytes, retain: bool) -> None:
        self.link.publish(topic, data, retain=retain)

    # -- the loop ----------------------------------------------------------------------------
    def run_forever(self, idle_timeout: float | None = None) -> None:
        """Serve requests until a ``stop`` (or ``idle_timeout`` seconds of silence)."""
        last = time.monotonic()
        connections = self.link.connections
        while self.running:
            if self.link.connections > connections:  # reconnected: what the broker may have lost goes again
                connections = self.link.connections
                self._redeliver_held("reconnected")
            since = self._unanswered_since
            if since is not None and self.model is not None and time.monotonic() - since > self._reregister_s:
                log.info("%s: no request in %.3g s since registering; registering again", self.me, self._reregister_s)
                self._register()
                self._reregister_s = min(2 * self._reregister_s, REREGISTER_MAX_S)
            probing = self.prober is not None and not self.prober.done
            if probing:
                self._tick_prober()
            item = self.link.receive(timeout=0.05 if probing else 1.0)
            self.stats.queue_full(self.link.dropped, self.link.dropped_by_lane)
            if item is None:
                if idle_timeout is not None and time.monotonic() - last > idle_timeout:
                    log.info("%s: idle for %.0f s, leaving", self.me, idle_timeout)
                    break
                continue
            last = time.monotonic()
            self.handle(item)

    def handle(self, item: Incoming) -> None:
        """Act on one message; whatever is wrong with it is logged and counted."""
        try:
            self._dispatch(item)
        except ProtocolVersionError as exc:
            self._version_mismatch(item, exc)
        except (CoveyError, OSError) as exc:
            log.warning("%s: dropped a message on %s: %s", self.me, item.topic, exc)
            self.stats.drop(type(exc).__name__)
        except Exception as exc:  # no single message may stop the agent
            log.exception("%s: unexpected error on %s (dropped)", self.me, item.topic)
            self.stats.drop(f"unexpected {type(exc).__name__}")

    def _dispatch(self, item: Incoming) -> None:
        t, me = self.topics, self.me
        if item.topic == t.artifact_manifest:
            self.artifact.add_manifest(item.payload)
            self._try_load_model()
        elif item.topic.startswith(t.artifact_filter[:-1]):
            self.artifact.add_chunk(item.payload)
            self._try_load_model()
        elif item.topic == t.server_status:
            self._on_server_status(item.payload)
        elif item.topic == t.inbox(me):
            self._on_request(decode_message(item.payload))
        elif item.topic == t.frames(me):
            self._on_frame(item.payload, SERVER_ID, item.received_at)
        elif item.topic.startswith(t.shared_root):
            if item.payload:  # an empty retained message: the server cleared a shared model
                self._on_frame(item.payload, SERVER_ID, item.received_at)
        else:
            sender = t.handoff_sender(item.topic, me)
            if sender is None:
                raise ProtocolError(f"unexpected topic {item.topic}")
            self._on_frame(item.payload, sender, item.received_at)

    def _version_mismatch(self, item: Incoming, exc: ProtocolVersionError) -> None:
        if item.topic not in (self.topics.inbox(self.me), self.topics.server_status):
            self.stats.drop("other protocol version")
            return
        self.exit_reason = (
            f"the server speaks covey protocol version {exc.version}, this agent version {PROTOCOL_VERSION}: "
            "install the covey release the server runs on this board"
        )
        log.error("%s: %s", self.me, self.exit_reason)
        self.running = False

    # -- the model and the server ---------------------------------------------------------
    def _try_load_model(self) -> None:
        if self.model is not None:
            return
        done = self.artifact.complete()
        if done is None:
            return
        data, manifest, raw = done
        path = self.artifact.save(self.cfg.state_dir, data, manifest, raw)
        # created in the worker thread, so interpreter helper threads inherit its priority
        model = self._in_worker(TFLiteModel, path, manifest, num_threads=self.cfg.threads)
        model.check_data(self.train_data.x, self.train_data.y)
        self.model = model
        self.runner = TaskRunner(
            self.me,
            self.topics,
            model,
            self.train_data,
            self.test_data,
            self.state,
            publish=self._publish,
            send=self._send,
            in_worker=self._in_worker,
            max_chunk=self.cfg.max_chunk,
        )
        log.info("%s: model %s ready (%s)", self.me, manifest.model, model.backend.name)
        self._bound_to_model(manifest.n_params)
        self._register()
        self._redeliver_held("restarted")  # results trained before a restart, never acknowledged

    def _lane_of(self, topic: str) -> str | None:
        """A peer's hand-off topic is that peer's lane; the server's topics have none."""
        return self.topics.handoff_sender(topic, self.me)

    def _bound_to_model(self, n_params: int) -> None:
        """Bound what one sender may hold here by the model's size: a payload is at most
        a float32 model or a link probe (``MAX_PROBE_BYTES``), a sender's partial
        payloads and its queued hand-off frames at most two of those, and a partial
        payload untouched for ``PARTIAL_MAX_AGE_S`` is dropped."""
        largest = max(4 * n_params, MAX_PROBE_BYTES) + 64 * 1024
        self._frames.max_bytes = largest
        self._frames.max_pending_per_sender = 2 * largest
        self._frames.max_pending_bytes = max(8 * largest, 64 * 1024 * 1024)
        self._frames.max_age_s = PARTIAL_MAX_AGE_S
        self.link.lane_max_bytes = 2 * largest + 2 * self.cfg.max_chunk

    def _on_server_status(self, payload: bytes) -> None:
        if not payload:
            return
        msg = decode_message(payload)
        if not isinstance(msg.body, ServerStatus) or msg.sender != SERVER_ID:
            raise ProtocolError("server/status carried something other than the server's status")
        status = msg.body
        if status.state != "running" or status.epoch == self._server_epoch:
            return
        known = self._server_epoch is not None
        self._server_epoch = status.epoch
        if self.model is not None and status.model_sha256 not in (None, self.model.manifest.sha256):
            # a new coordinator with another model: its artifact came before this status
            log.info("%s: the run's model changed; loading the new one", self.me)
            self.model, self.runner = None, None
            self._waiting.clear()
            self._try_load_model()  # registers once loaded
            return
        if self.model is not None:
            log.info("%s: %s coordinator (epoch %s); registering", self.me, "a new" if known else "the", status.epoch)
            self._register()
            if known:
                self._redeliver_held("a new coordinator")

    # -- requests ---------------------------------------------------------------------------
    def _on_request(self, msg: Message) -> None:
        if msg.run != self.cfg.run:
            raise ProtocolError(f"request for run {msg.run!r}, this device serves {self.cfg.run!r}")
        if msg.sender != SERVER_ID:
            raise ProtocolError(f"request from {msg.sender!r}; only the server sends requests")
        body = msg.body
        if isinstance(body, Ping):
            self._send(Pong(body.t), msg.round)
            return
        self._unanswered_since, self._reregister_s = None, REREGISTER_S  # a request: the coordinator knows it
        if isinstance(body, Stop):
            log.info("%s: the server ended the run%s", self.me, f": {body.reason}" if body.reason else "")
            self.running = False
        elif isinstance(body, ResendRequest):
            self._work().resend(body)
        elif isinstance(body, Ack):
            n = self.state.forget(body.task_ids)
            log.info("%s: the server holds %d of my results; forgot them", self.me, n)
        elif isinstance(body, (TrainRequest, PretrainRequest, EvaluateRequest)):
            self._accept_request(body, msg.round)
        elif isinstance(body, Listen):
            until = time.monotonic() + body.seconds
            for peer in body.peers:
                if peer != self.me:
                    self._listening[peer] = max(self._listening.get(peer, 0.0), until)
            self._sync_peers()
        elif isinstance(body, LinkProbeRequest):
            if self.prober is not None and self.prober.task_id == body.task_id:
                self.stats.drop("duplicate link probe request")  # QoS 1 may bring it twice
                return
            if self.prober is not None and not self.prober.done:
                log.info("%s: a new link probe request replaces %s", self.me, self.prober.task_id)
            self.prober = LinkProber(
                self.me, self.topics, body, msg.round, publish=self._publish, send=self._send, wifi=read_wifi
            )
            self._sync_peers()  # its echoes come back on the peers' hand-off topics
            self.prober.start()
        else:
            raise ProtocolError(f"devices do not handle {msg.type!r} messages")

    def _accept_request(self, request: Request, rnd: int) -> None:
        task_id = request.task_id
        if self.state.is_done(task_id) or task_id in self._waiting:
            # a resumed coordinator re-issues its round: a result it may have lost goes again
            resent = (
                isinstance(request, TrainRequest)
                and self.runner is not None
                and self.runner.redeliver(task_id, request.next)
            )
            self.stats.drop("duplicate request (result sent again)" if resent else "duplicate request")
            return
        self._waiting.add(request, rnd)
        self._sync_peers()  # a chain's predecessor hands its model on straight to this device
        log.info("%s: round %d %s request %s; waiting for its model", self.me, rnd, type(request).__name__, task_id)
        new = [k for k in request.shared if k not in self._shared_subscribed]
        if new:
            self._shared_subscribed.update(new)
            self.link.subscribe(*(self.topics.shared_filter(k) for k in new))

    def _on_frame(self, frame: bytes, sender: str, received_at: float | None = None) -> None:
        payload = self._frames.add(frame, sender=sender, received_at=received_at or None)
        if payload is None:
            return
        h = payload.header
        if h.kind in ("probe", "echo"):
            self._on_probe_frame(payload.header, sender)
            return
        try:
            runner = self._work()
            ready = self._waiting.accept(payload, runner.model.n_params)
            if not ready and payload.header.extra.shared is not None:
                self.stats.drop("shared model for no waiting task")
            for task in ready:
                log.info("%s: model for %s arrived from %s", self.me, task.request.task_id, payload.header.sender)
                if isinstance(task.request, EvaluateRequest):
                    runner.evaluate(task.request, task.round, task.models)
                elif isinstance(task.request, PretrainRequest):
                    assert task.weights is not None
                    runner.pretrain(task.request, task.round, task.weights)
                else:
                    assert task.weights is not None
                    self._train(runner, task)
        finally:
            self._drop_unused_shared()
            self._sync_peers()

    def _train(self, runner: TaskRunner, task: Ready) -> None:
        """Run a train request; training that diverges is reported (``failed``), so the
        group goes on without this device at once instead of at its deadline."""
        assert isinstance(task.request, TrainRequest) and task.weights is not None
        try:
            runner.train(task.request, task.round, task.weights, task.key, task.inbound, task.exclusive)
        except WeightsError as exc:
            log.warning("%s: training %s failed: %s; told the server", self.me, task.request.task_id, exc)
            self.stats.drop("training diverged")
            runner.report_failed(task.request, task.round, str(exc))

    def _sync_peers(self) -> None:
        """Subscribe to exactly the peers this device may hear from now: the predecessors of
        its waiting train requests, the peers it probes, and those a listen names, until
        it expires. The broker's ACL binds a hand-off topic to its sender (``from/%u``),
        so no other device's frame is delivered here."""
        now = time.monotonic()
        self._listening = {p: until for p, until in self._listening.items() if until > now}
        wanted = set(self._listening) | self._waiting.predecessors()
        if self.prober is not None and not self.prober.done:
            wanted |= set(self.prober.paths) - {SERVER_ID}
        wanted.discard(self.me)
        new, old = wanted - self._peers_subscribed, self._peers_subscribed - wanted
        if new:
            self.link.subscribe(*(self.topics.handoff(self.me, p) for p in sorted(new)))
        if old:
            self.link.unsubscribe(*(self.topics.handoff(self.me, p) for p in sorted(old)))
        self._peers_subscribed = wanted

    def _tick_prober(self) -> None:
        """Time out a probe; what goes wrong is logged and ends the measurement, not the agent."""
        assert self.prober is not None
        try:
            self.prober.tick()
        except Exception:  # no measurement may stop the agent
            log.exception("%s: link measurement %s failed; dropped", self.me, self.prober.task_id)
            self.stats.drop("link measurement failed")
            self.prober.done = True

    def _on_probe_frame(self, h: FrameHeader, sender: str) -> None:
        """Echo a peer's link probe at once; hand an echo to the prober that waits for it."""
        task_id = h.extra.task_id or ""
        if h.kind == "probe":
            if sender == SERVER_ID:
                raise ProtocolError("the server sends echoes, not probes")
            send_probe_frame(
                self._publish,
                self.topics.handoff(sender, self.me),
                kind="echo",
                run=self.cfg.run,
                sender=self.me,
                task_id=task_id,
                index=h.extra.index,
                size=0,
            )
        elif self.prober is None or not self.prober.on_echo(task_id, h.extra.index, sender):
            self.stats.drop("echo of no probe in flight")  # late, after its probe timed out

    def _drop_unused_shared(self) -> None:
        """Unsubscribe from shared models no waiting task needs any more."""
        needed = self._waiting.shared_keys()
        unused = self._shared_subscribed - needed
        if unused:
            self._shared_subscribed -= unused
            self.link.unsubscribe(*(self.topics.shared_filter(k) for k in unused))

    # -- work ------------------------------------------------------------------------------
    def _redeliver_held(self, why: str) -> None:
        if self.runner is not None and self.state.held:
            n = self.runner.redeliver_all()
            log.info("%s: %s: delivered %d unacknowledged results again", self.me, why, n)

    def _work(self) -> TaskRunner:
        if self.runner is None:
            raise ModelError("no model artifact yet; cannot train")
        return self.runner

    def _in_worker(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A model call in the background-priority model thread (``device/worker.py``)."""
        return self.worker.run(fn, *args, keep_waiting=lambda: self.running, **kwargs)

    def close(self) -> None:
        """Leave: never raises, whatever state the connection is in."""
        self.worker.close()
        with contextlib.suppress(TransportError, OSError, RuntimeError):
            self.link.publish(self.topics.status(self.me), b"offline", retain=True, wait=2.0)
        with contextlib.suppress(Exception):
            self.link.close()


def _available_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def load_device_data(path: Path, user: str | None, test: Path | None) -> tuple[Dataset, Dataset | None]:
    """A device's train (and optional test) set from LEAF, .npz or .csv."""
    from device.data import read_dataset
    from device.errors import DataError

    train = read_dataset(path, user=user)
    if len(train) == 0:
        raise DataError(f"{path} holds no training samples for this device")
    return train, read_dataset(test, user=user) if test else None
