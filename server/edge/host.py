"""What runs on a site's edge beside its broker (``covey edge run``): the group managers
the coordinator hands it, and the relay of everything else its boards send.

The edge host logs in to its own broker as the edge's ``coordinator`` user and reads its
boards' ``results`` and ``frames`` topics, which its bridge does not forward
(``server/site/edge.py``). For each :class:`~server.edge.messages.EdgeTask` it makes the
group's manager with the coordinator's own code
(:meth:`~server.execution.round.RoundExecution.make_manager`: the same requests, task
ids, deadlines, hand-off screening and skips as at the centre) over the edge's broker,
so a chain's hand-offs and a parallel group's models stay in the room. When the group
is done it sends the coordinator one model (the chain's last, or the parallel members'
sample-weighted mean), in the run's codec (:mod:`server.edge.uplink`), and an
:class:`~server.edge.messages.EdgeReport`. What its boards
send that none of its groups waits for (results of groups the coordinator runs, pongs,
link reports, evaluation replies) it republishes unchanged under
``covey/<run>/relay/``, which the bridge maps back to the board's own topic at the
centre: the sender stays the board the topic names, and the central ACL still lets the
edge speak only for its room.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device.errors import CoveyError, ProtocolError
from device.mqtt import Incoming, MqttLink, TlsFiles, Will
from device.protocol import (
    SERVER_ID,
    FrameExtra,
    Payload,
    Reassembler,
    Topics,
    TrainFailed,
    TrainResult,
    check_weights,
    decode_message,
    parse_frame,
    send_model,
)
from device.protocol.codecs import ErrorFeedback
from device.transport import Link, LinkFactory
from server.edge.messages import EdgeMember, EdgeReport, EdgeTask, decode_edge, encode_edge
from server.edge.proxy import HELD_MODELS, edge_topics, edge_user, model_key
from server.edge.state import EdgeState
from server.edge.uplink import Upload, encode_upload
from server.execution.group_model import group_model
from server.execution.manager import GroupManager
from server.execution.ports import PolledBus
from server.execution.round import ExecutionSettings, RoundExecution
from server.execution.shared import SharedModels
from server.hops import HopBound
from server.strategies.base import GroupPlan, TrainConfig

log = logging.getLogger("covey.edge")
REPORTS_KEPT = 64  # finished tasks whose report a repeated task gets again
MAX_MODEL_BYTES = 1 << 30


@dataclass(frozen=True)
class EdgeSettings:
    """Where the edge's broker is and who the edge is (``DIR/edges/<name>/``)."""

    run: str
    name: str
    devices: tuple[str, ...]
    host: str
    port: int
    username: str | None = "coordinator"
    password: str | None = None
    tls: TlsFiles | None = None
    max_chunk: int = 900_000
    state_dir: Path | None = None  # where the edge keeps its tasks (server/edge/state.py); None: nowhere


@dataclass
class _Running:
    task: EdgeTask
    manager: GroupManager
    start: np.ndarray


class EdgeHost:
    """The edge's group managers and relay (module docstring).

    Parameters
    ----------
    settings : the edge's broker, name and devices.
    link_factory : how to reach the broker (``MqttLink``).
    """

    def __init__(self, settings: EdgeSettings, link_factory: LinkFactory = MqttLink) -> None:
        self.settings = s = settings
        self.topics = Topics(s.run)
        self.user = edge_user(s.name)
        self.devices = frozenset(s.devices)
        self.tasks_topic, self.models_topic = edge_topics(self.topics, s.name)
        self.status_topic = self.topics.status(self.user)
        self.link: Link = link_factory(
            f"covey-{s.run}-{self.user}",
            s.host,
            s.port,
            username=s.username,
            password=s.password,
            tls=s.tls,
            clean_session=False,
            will=Will(self.status_topic, b"offline", retain=True),
            lane_of=self._lane_of,
        )
        self.execution = RoundExecution(
            ExecutionSettings(s.run, "relay", 60.0, s.max_chunk, "fp32"),
            topics=self.topics,
            bus=PolledBus(self._publish, self.pump),
            clock=time.monotonic,
            known=self.devices,
            shared=SharedModels(self.topics, self._publish, s.max_chunk, f"{s.name}-{int(time.time())}"),
            bases={},
            downlinks=None,
            task_prefix="edge",
        )
        self.models: OrderedDict[str, np.ndarray] = OrderedDict()  # start models held, newest last
        self.pending: dict[str, EdgeTask] = {}  # tasks waiting for their start model
        self.running: dict[str, _Running] = {}
        self.finished: OrderedDict[str, tuple[bytes, np.ndarray | None, EdgeReport]] = OrderedDict()
        self._from_central = Reassembler(max_bytes=MAX_MODEL_BYTES, max_pending_bytes=2 * MAX_MODEL_BYTES)
        self._from_boards = Reassembler(max_bytes=MAX_MODEL_BYTES, max_pending_bytes=4 * MAX_MODEL_BYTES)
        self.relayed = 0
        self.relayed_outputs = 0  # of which training outputs (results and their models) of groups run centrally
        self.groups_done = 0
        self.models_received = 0  # start models the coordinator had to send (the rest were held here)
        self.state = EdgeState(s.state_dir) if s.state_dir is not None else None
        self.resumed = 0  # tasks taken up again from the state after a restart
        self.sent_up_bytes = 0  # the payloads of the group models sent up
        # each group's uplink residual (server/edge/uplink.py), by its members: a group
        # regrouped or split under the same id starts from none
        self.feedback: OrderedDict[frozenset[str], ErrorFeedback] = OrderedDict()

    # -- the link ----------------------------------------------------------------------------
    def _lane_of(self, topic: str) -> str | None:
        found = self.topics.device_of(topic)
        return found[0] if found is not None else None

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.link.publish(topic, payload, retain=retain)

    def connect(self, timeout: float = 30.0) -> None:
        self.link.connect(timeout)
        root = self.topics.root
        self.link.subscribe(f"{root}/from/+/results", f"{root}/from/+/frames", self.tasks_topic, self.models_topic)
        self._publish(self.status_topic, b"online", True)
        log.info("edge %s: managing groups of %s for run %s", self.settings.name, board_list(self.devices), root)

    def resume(self) -> None:
        """Take up what the edge was doing before it stopped (``state_dir``): its finished
        reports, for a coordinator that asks again, and its tasks, started again with the
        same task ids (the members that had trained deliver the results they hold)."""
        if self.state is None:
            return
        tasks, finished = self.state.load()
        for report, model in finished:
            self.finished[report.key] = (encode_edge(report, self.settings.run), model, report)
        for task in tasks:
            start = self.state.load_model(task.model)
            self.resumed += 1
            log.info("round %d group %d: taken up again after a restart", task.round, task.group_id)
            if start is None:
                self._on_task_without_model(task)
            else:
                self._hold(start)
                self._start(task, start)

    def _persist(self) -> None:
        if self.state is None:
            return
        tasks = [r.task for r in self.running.values()] + list(self.pending.values())
        finished = [
            (report, None if model is None else model_key(model)) for _, model, report in self.finished.values()
        ]
        self.state.save(tasks, finished)

    def close(self) -> None:
        if self.link.connected:
            self.link.publish(self.status_topic, b"offline", retain=True, wait=5.0)
        self.link.close()

    def serve(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set: handle messages, tick the managers, report groups."""
        while not stop.is_set():
            self.step(0.05)

    def step(self, timeout: float) -> None:
        self.pump(timeout)
        now = time.monotonic()
        for r in list(self.running.values()):
            try:
                r.manager.tick(now)
                if r.manager.done:
                    self._finish(r)
            except Exception:  # a fault of one group's must not stop the others (its proxy times out)
                log.exception("round %d group %d: failed at the edge", r.task.round, r.task.group_id)
                self.running.pop(r.task.key, None)
                if r.manager in self.execution.managers:
                    self.execution.managers.remove(r.manager)
                self._persist()

    # -- what arrives ------------------------------------------------------------------------
    def pump(self, timeout: float) -> None:
        item = self.link.receive(timeout)
        if item is None:
            return
        try:
            self._dispatch(item)
        except CoveyError as exc:
            log.warning("dropped %s: %s", item.topic, exc)
        except Exception:  # no single message, from anyone, may stop the edge
            log.exception("unexpected error handling %s", item.topic)

    def _dispatch(self, item: Incoming) -> None:
        if item.topic == self.tasks_topic:
            body = decode_edge(item.payload, self.settings.run)
            if not isinstance(body, EdgeTask):
                raise ProtocolError(f"{type(body).__name__} on the tasks topic")
            self._on_task(body)
            return
        if item.topic == self.models_topic:
            payload = self._from_central.add(item.payload, sender=SERVER_ID)
            if payload is not None:
                self._on_model(payload)
            return
        who = self.topics.device_of(item.topic)
        if who is None or who[0] not in self.devices:
            return  # its own messages, or a board of another room (the edge's ACL lets none in)
        device, kind = who
        handled, output = self._result_here(device, item) if kind == "results" else self._frame_here(device, item)
        if not handled:  # not for a group run here: on to the coordinator, as the board sent it
            self.relayed += 1
            self.relayed_outputs += output
            self._publish(f"{self.topics.root}/relay/from/{device}/{kind}", item.payload)

    def _result_here(self, device: str, item: Incoming) -> tuple[bool, bool]:
        """Whether a group run here took the message, and whether it is a training output."""
        try:
            msg = decode_message(item.payload)
        except ProtocolError:
            return False, False  # the coordinator says what is wrong with it
        body = msg.body
        output = isinstance(body, TrainResult | TrainFailed)
        if msg.sender != device or msg.run != self.settings.run:
            return False, output
        if isinstance(body, TrainResult):
            return self.execution.on_result(device, body) != "unexpected", True
        if isinstance(body, TrainFailed):
            return self.execution.on_refused(device, body.task_id, f"its training failed ({body.reason})"), True
        return False, False

    def _frame_here(self, device: str, item: Incoming) -> tuple[bool, bool]:
        try:
            header, _ = parse_frame(item.payload)
        except ProtocolError:
            return False, False
        task_id = header.extra.task_id
        owner = next((r for r in self.running.values() if r.manager.knows(device, task_id)), None)
        if header.kind != "result" or owner is None:
            return False, header.kind == "result"
        payload = self._from_boards.add(item.payload, sender=device, received_at=item.received_at or None)
        if payload is None:
            return True, True
        try:
            weights = check_weights(payload, int(owner.start.shape[0]), None)
        except ProtocolError as exc:
            self.execution.on_refused(device, task_id or "", f"its output was refused ({exc})")
            raise
        self.execution.on_frame(payload, weights)
        return True, True

    # -- tasks -------------------------------------------------------------------------------
    def _on_task(self, task: EdgeTask) -> None:
        key = task.key
        if key in self.finished:  # the coordinator asked again (its link came back): the same answer
            self._send_report(*self.finished[key])
            return
        if key in self.running or key in self.pending:
            return
        strangers = sorted(set(task.members) - self.devices)
        if strangers:
            log.warning("task %s names devices not behind this edge: %s; reported as skipped", key, strangers)
            report = EdgeReport(task.round, task.group_id, task.task_prefix, "done", skipped=task.members)
            self._remember(key, None, report)
            return
        start = self.models.get(task.model)
        if start is None:
            self._on_task_without_model(task)
            return
        self._start(task, start)

    def _on_task_without_model(self, task: EdgeTask) -> None:
        """Wait for the start model, and ask the coordinator for it (it sends it with the
        task unless it believes the edge holds it)."""
        self.pending[task.key] = task
        self._persist()
        report = EdgeReport(task.round, task.group_id, task.task_prefix, "missing_model", model=task.model)
        self._publish(self.topics.results(self.user), encode_edge(report, self.settings.run))

    def _on_model(self, payload: Payload) -> None:
        weights = check_weights(payload, int(payload.array.shape[0]), None)
        self.models_received += 1
        self._hold(weights)
        key = model_key(weights)
        for task_key_, task in list(self.pending.items()):
            if task.model == key:
                del self.pending[task_key_]
                self._start(task, weights)

    def _hold(self, weights: np.ndarray) -> None:
        key = model_key(weights)
        self.models[key] = weights
        self.models.move_to_end(key)
        while len(self.models) > HELD_MODELS:
            self.models.popitem(last=False)

    def _start(self, task: EdgeTask, start: np.ndarray) -> None:
        t = task.train
        train = TrainConfig(t.epochs, t.batch, t.lr, t.mu, t.max_steps)
        hop = None
        if task.hop is not None:
            ref = float("nan") if task.hop.reference is None else task.hop.reference
            hop = HopBound(ref, task.hop.norm_factor, task.hop.clip_factor)
        group = GroupPlan(task.group_id, tuple(task.members), task.mode, "start")
        manager = self.execution.make_manager(
            group,
            task.round,
            start,
            train,
            task_prefix=task.task_prefix,
            seed=task.seed,
            hop=hop,
            handoff=task.handoff,
            deadline_s=task.deadline_s,
        )
        self.execution.managers.append(manager)
        self.running[task.key] = _Running(task, manager, start)
        if self.state is not None:
            self.state.save_model(start)
            self._persist()
        manager.start(time.monotonic())
        log.info("round %d group %d: %d members, run here", task.round, task.group_id, len(task.members))

    def _finish(self, r: _Running) -> None:
        task, manager = r.task, r.manager
        result = manager.result()
        manager.release()
        self.execution.managers.remove(manager)
        del self.running[task.key]
        upload = None
        model = group_model(result, r.task.rule, r.start)
        if model is not None:  # in the run's codec; what the coordinator decodes is the model now
            feedback = self._feedback_of(task.members)
            upload = encode_upload(model, r.start, task.model, task.codec, feedback)
            model = upload.received
            self._hold(model)
        report = EdgeReport(
            task.round,
            task.group_id,
            task.task_prefix,
            "done",
            tuple(EdgeMember(m.client_id, m.n_samples, m.train_loss) for m in result.members),
            result.skipped,
            result.refused,
            None if model is None else model_key(model),
        )
        self._remember(task.key, model, report, upload)
        self.groups_done += 1
        log.info(
            "round %d group %d: done, %d trained, %d skipped; its model sent up",
            task.round,
            task.group_id,
            len(result.members),
            len(result.skipped),
        )

    def _feedback_of(self, members: Iterable[str]) -> ErrorFeedback:
        key = frozenset(members)
        feedback = self.feedback.pop(key, None) or ErrorFeedback()
        self.feedback[key] = feedback  # the most recent last
        while len(self.feedback) > REPORTS_KEPT:
            self.feedback.popitem(last=False)
        return feedback

    def _remember(self, key: str, model: np.ndarray | None, report: EdgeReport, upload: Upload | None = None) -> None:
        """Keep ``report`` (and ``model``, what the coordinator decodes) for a repeated
        task, and send both: the model as ``upload`` the first time, ``raw`` after."""
        data = encode_edge(report, self.settings.run)
        self.finished[key] = (data, model, report)
        while len(self.finished) > REPORTS_KEPT:
            self.finished.popitem(last=False)
        if self.state is not None and model is not None:
            self.state.save_model(model)
        self._persist()  # before it is sent: a report sent is a report the edge can send again
        self._send_report(data, model, report, upload)

    def _send_report(
        self, data: bytes, model: np.ndarray | None, report: EdgeReport, upload: Upload | None = None
    ) -> None:
        if model is not None:
            self.sent_up_bytes += (model if upload is None else upload.payload).nbytes
            send_model(
                self._publish,
                self.topics.uploads(self.user),
                model if upload is None else upload.payload,
                codec="raw" if upload is None else upload.codec,
                base=None if upload is None else upload.base,
                kind="result",
                run=self.settings.run,
                round=report.round,
                group=report.group_id,
                sender=self.user,
                max_chunk=self.settings.max_chunk,
                extra=FrameExtra(report.key, position=0),
            )
        self._publish(self.topics.results(self.user), data)


def board_list(devices: Iterable[str], shown: int = 6) -> str:
    """Boards for a log line: all of a few, else how many and the first and last."""
    ordered = sorted(devices)
    if len(ordered) <= shown:
        return ", ".join(ordered)
    return f"{len(ordered)} boards ({ordered[0]} ... {ordered[-1]})"
