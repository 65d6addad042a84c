"""The simulator's bus: the coordinator's group managers talk to virtual devices that
run a board's task code, in one process, on a clock of their own.

:class:`VirtualBus` is an :class:`~server.execution.ports.ExecutionBus`.
:class:`~server.execution.round.RoundExecution` publishes on it exactly what it
publishes on MQTT: requests, model frames and retained shared models. The bus
delivers each message in publish order to the :class:`VirtualDevice` its topic names,
which handles it as ``device/agent.py`` does, with the same pieces: requests wait in
:class:`~device.waiting.WaitingTasks` until their model arrives; models are checked and
decoded by them (an ``int8`` downlink delta against the model the device holds);
outputs are encoded, handed on and reported by :class:`~device.tasks.TaskRunner`,
which also answers resend requests from the outputs it holds. What devices publish
comes back through the bus to the execution (``on_frame``, ``on_result``,
``on_refused``) or to the successor a direct hand-off names.

When nothing is left to deliver, the training tasks whose models arrived run as one
batch on the simulator's workers (:class:`~server.simulation.trainer.Trainer`, one
interpreter per worker: any number of workers gives the same results), and their
outputs are published in the order the tasks became ready. When nothing is left to
train either, the clock moves to the managers' next deadline at once: a silent device
costs no wall time. The order of everything is fixed, so a run is reproducible.

Models in the run's codec move as a board sends them. In ``fp32`` runs a model is
passed whole, a read-only view of the sender's array (no frames are built, hashed or
reassembled; :func:`~device.protocol.whole_payload`: its header's ``sha256`` is a unique
token, since an ``fp32`` run names no model by its hash); every other payload travels as
its frames. Either way the bytes of the frames are counted where a board's link
would carry them: ``down``, what reached a device from the server (once per device
that answers: a shared model is counted for each device it reached); ``up``, what
devices sent (a hand-off to a silent successor too); ``peer``, a direct hand-off a
device received from another (it crosses the devices' links twice).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device.data import Dataset
from device.errors import CoveyError, ProtocolError
from device.protocol import (
    DEFAULT_MAX_CHUNK,
    SERVER_ID,
    FrameCodec,
    Message,
    Payload,
    Reassembler,
    ResendRequest,
    Topics,
    TrainFailed,
    TrainRequest,
    TrainResult,
    WireCodec,
    check_weights,
    decode_message,
)
from device.runtime import TFLiteModel
from device.state import AgentState
from device.tasks import TaskRunner
from device.waiting import Ready, WaitingTasks
from server.execution.round import RoundExecution
from server.simulation.datasets import ClientData
from server.simulation.trainer import Trained

log = logging.getLogger("covey.server")

Report = Callable[[int, Trained], None]  # what follows call i of a batch, on the thread that ran it
# runs a batch of Trainer.train calls on the workers, and ``report`` for each (on a worker
# thread, or here after worker processes)
Train = Callable[[list[tuple[Any, ...]], list[float], Report], None]


def _no_worker(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a virtual device trains on the simulator's workers (VirtualBus), not in its TaskRunner")


def _no_send(body: Any, rnd: int) -> None:
    raise AssertionError("virtual devices answer training requests only")


@dataclass
class _Delivery:
    """One message on its way: where it goes and who the bus says sent it."""

    topic: str
    sender: str
    data: bytes | None = None  # a message or one frame
    payload: Payload | None = None  # or a whole model (fp32 runs)
    size: int = 0  # the bytes of the frames that carry it
    retain: bool = False


class VirtualDevice:
    """One client as a board: the agent's handling of training requests and models,
    and its :class:`~device.tasks.TaskRunner` (outputs held in memory until the round
    ends). What it publishes waits in its :attr:`outbox` until the bus takes it, in a
    fixed order, whichever thread finished its task first."""

    def __init__(
        self,
        me: str,
        topics: Topics,
        model: TFLiteModel,
        train_data: Dataset,
        carries: frozenset[FrameCodec],
        max_chunk: int,
    ) -> None:
        self.me = me
        self.outbox: list[_Delivery] = []
        publish = _Publisher(me, carries, self.outbox.append)
        self.waiting = WaitingTasks()
        self.frames = Reassembler()
        self.state = AgentState(Path(me), persist=False)
        self.n_params = model.n_params
        self.runner = TaskRunner(
            me,
            topics,
            model,
            train_data,
            None,
            self.state,
            publish=publish,
            send=_no_send,
            in_worker=_no_worker,
            max_chunk=max_chunk,
        )

    def on_request(self, msg: Message) -> tuple[str, ...]:
        """A request from the server; the shared models it waits for."""
        body = msg.body
        if isinstance(body, ResendRequest):
            self.runner.resend(body)
            return ()
        if not isinstance(body, TrainRequest):
            raise ProtocolError(f"virtual devices handle train and resend requests, not {msg.type!r}")
        if self.state.is_done(body.task_id) or body.task_id in self.waiting:
            self.runner.redeliver(body.task_id, body.next)  # as the agent does for a repeated request
            return ()
        self.waiting.add(body, msg.round)
        return body.shared

    def on_model(self, payload: Payload) -> list[Ready]:
        """A whole model payload: the tasks it makes ready."""
        return self.waiting.accept(payload, self.n_params)


@dataclass
class _Batch:
    """Training tasks whose models arrived, in the order they did."""

    tasks: list[tuple[VirtualDevice, Ready]] = field(default_factory=list)


class VirtualBus:
    """The in-process bus of one simulated run (see the module docstring).

    Parameters
    ----------
    topics : the run's topics.
    model : an interpreter of the run's model (its size and classes; nothing is trained on it).
    data : client id -> its data (read at each task: a distribution shift reaches it).
    train : runs a batch of :meth:`~server.simulation.trainer.Trainer.train` calls on
        the workers, costliest first, and calls ``report(i, trained)`` for call ``i``:
        on the worker thread that trained it, or here after worker processes. Two rules
        make that safe: a device has at most one task in a batch (:meth:`_train_batch`),
        and a report reads nothing of the shared interpreter but its manifest.
    silent : devices that never answer (switched off): nothing reaches them.
    codec : the run's wire codec; ``fp32`` models are passed whole.
    max_chunk : the frames' payload bytes, as the coordinator's.
    """

    def __init__(
        self,
        topics: Topics,
        model: TFLiteModel,
        data: Mapping[str, ClientData],
        train: Train,
        *,
        silent: Collection[str] = frozenset(),
        codec: WireCodec = "fp32",
        max_chunk: int = DEFAULT_MAX_CHUNK,
    ) -> None:
        self.topics, self.model, self.data, self.train = topics, model, data, train
        self.silent, self.max_chunk = frozenset(silent), max_chunk
        self.carries: frozenset[FrameCodec] = frozenset({"raw"}) if codec == "fp32" else frozenset()
        self.publish = _Publisher(SERVER_ID, self.carries, self._from_server)  # the managers'
        self.execution: RoundExecution | None = None
        self.devices: dict[str, VirtualDevice] = {}
        self.clock = 0.0
        self.wire = {"down": 0, "up": 0, "peer": 0}
        self._queue: deque[_Delivery] = deque()
        self._retained: dict[str, list[_Delivery]] = {}  # shared key -> its chunks
        self._server_frames = Reassembler()
        self._batch = _Batch()
        self.dropped = 0  # messages a device or the managers refused (logged at debug level)

    # -- the port ---------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock

    def wait(self, until: float) -> None:
        """Deliver everything queued; else train what is ready; else move the clock to ``until``."""
        if self._queue:
            while self._queue:
                self._deliver(self._queue.popleft())
        elif self._batch.tasks:
            self._train_batch()
        else:
            self.clock = max(self.clock, until)

    # -- the round ------------------------------------------------------------------------
    def device(self, client: str) -> VirtualDevice:
        if client not in self.devices:
            self.devices[client] = VirtualDevice(
                client, self.topics, self.model, self.data[client].train, self.carries, self.max_chunk
            )
        return self.devices[client]

    def end_round(self, task_ids: Mapping[str, list[str]], base_of: Callable[[str], str | None] | None) -> None:
        """What the coordinator's acknowledgement does after its checkpoint: devices forget
        the outputs they held; what is still queued or unsent is lost, as a round's late
        messages are (also after a round that raised). ``base_of``: the model the server
        may still send a device a delta against (``DownlinkModels.base_of``; None: no
        deltas in this run); a device forgets any other, which a board would keep unused
        (the simulator would hold one model per client ever sampled)."""
        for client, ids in task_ids.items():
            if client in self.devices:
                self.devices[client].state.forget(ids)
        for device in self.devices.values():
            device.waiting.clear()
            device.outbox.clear()
            device.frames = Reassembler()  # a partial payload of this round is never completed
            if device.waiting.held and (base_of is None or base_of(device.me) not in device.waiting.held):
                device.waiting.held = {}
        self._queue.clear()
        self._batch = _Batch()
        self._server_frames = Reassembler()

    # -- routing --------------------------------------------------------------------------
    def _from_server(self, item: _Delivery) -> None:
        """The managers publish: queued, and a shared model kept while it is retained."""
        if item.topic.startswith(self.topics.shared_root):
            key = item.topic[len(self.topics.shared_root) :].split("/", 1)[0]
            if item.data == b"" and item.retain:  # the round is over: the manager cleared it
                self._retained.pop(key, None)
                return
            self._retained.setdefault(key, []).append(item)
        self._queue.append(item)

    def _take_outbox(self, device: VirtualDevice) -> None:
        """What ``device`` published enters the bus, counted as sent (``up``)."""
        for item in device.outbox:
            self.wire["up"] += item.size
            self._queue.append(item)
        device.outbox.clear()

    def _deliver(self, item: _Delivery) -> None:
        t = self.topics
        try:
            if item.sender != SERVER_ID:
                self._to_server_or_peer(item)
            elif item.topic.startswith(t.shared_root):
                key = item.topic[len(t.shared_root) :].split("/", 1)[0]
                for client in sorted(self.devices):  # the devices subscribed to it now
                    if key in self.devices[client].waiting.shared_keys():
                        self._shared_to(client, item)
            else:
                client = item.topic[len(f"{t.root}/device/") :].split("/", 1)[0]
                if client in self.silent:
                    return
                if item.topic == t.inbox(client):
                    assert item.data is not None
                    device = self.device(client)
                    try:
                        for key in device.on_request(decode_message(item.data)):
                            for chunk in self._retained.get(key, ()):  # a subscription gets what is retained
                                self._model_to(client, chunk, SERVER_ID)
                    finally:
                        self._take_outbox(device)  # a resend
                elif item.topic == t.frames(client):
                    self._model_to(client, item, SERVER_ID)
                # an assignment (retained, for a board's display) asks nothing of the device
        except CoveyError as exc:  # as a board or the coordinator drops it: the round goes on
            self.dropped += 1
            log.debug("simulation: dropped a message from %s on %s: %s", item.sender, item.topic, exc)

    def _shared_to(self, client: str, item: _Delivery) -> None:
        """A shared model's chunk to one subscriber: what it refuses is its own loss."""
        try:
            self._model_to(client, item, SERVER_ID)
        except CoveyError as exc:
            self.dropped += 1
            log.debug("simulation: %s dropped shared model %s: %s", client, item.topic, exc)

    def _model_to(self, client: str, item: _Delivery, sender: str) -> None:
        """A model (whole or one frame) reaches ``client`` from ``sender``."""
        if client in self.silent:
            return
        device = self.device(client)
        self.wire["down" if sender == SERVER_ID else "peer"] += item.size
        payload = item.payload if item.payload is not None else device.frames.add(item.data or b"", sender=sender)
        if payload is None:
            return
        for ready in device.on_model(payload):
            if not isinstance(ready.request, TrainRequest):
                raise ProtocolError(f"virtual devices train; {type(ready.request).__name__} is not theirs")
            self._batch.tasks.append((device, ready))

    def _to_server_or_peer(self, item: _Delivery) -> None:
        t, device = self.topics, item.sender
        peer = t.handoff_sender_any(item.topic)
        if peer is not None:  # a direct hand-off to the device the topic names
            to = item.topic[len(f"{t.root}/device/") :].split("/", 1)[0]
            self._model_to(to, item, device)
            return
        execution = self.execution
        assert execution is not None, "the bus runs a RoundExecution"
        if item.topic == t.uploads(device):
            payload = item.payload if item.payload is not None else self._server_frames.add(item.data or b"", device)
            if payload is not None:
                self._output(execution, device, payload)
        elif item.topic == t.results(device):
            assert item.data is not None
            msg = decode_message(item.data)
            if isinstance(msg.body, TrainResult):
                execution.on_result(device, msg.body)
            elif isinstance(msg.body, TrainFailed):
                why = f"its training failed ({msg.body.reason}: {msg.body.detail or 'no detail'})"
                execution.on_refused(device, msg.body.task_id, why)

    def _output(self, execution: RoundExecution, device: str, payload: Payload) -> None:
        """A device's output reaches its manager (checked as the coordinator's inbox does)."""
        h = payload.header
        try:
            weights = check_weights(payload, self.model.n_params, execution.bases)
        except ProtocolError as exc:
            execution.on_refused(device, h.extra.task_id or "", f"its output was refused ({exc})")
            return
        execution.on_frame(payload, weights)

    # -- training -------------------------------------------------------------------------
    def _train_batch(self) -> None:
        """Train the ready tasks, one per device (a device's next task waits for the next
        batch, as a board trains one at a time); then take the outputs in task order."""
        batch: list[tuple[VirtualDevice, Ready]] = []
        later: list[tuple[VirtualDevice, Ready]] = []
        for device, ready in self._batch.tasks:
            (later if any(d is device for d, _ in batch) else batch).append((device, ready))
        self._batch = _Batch(later)
        calls: list[tuple[Any, ...]] = []
        for device, ready in batch:
            request = ready.request
            assert isinstance(request, TrainRequest) and ready.weights is not None
            device.runner.train_data = self.data[device.me].train  # after a distribution shift: its data now
            calls.append((ready.weights, device.me, request.train, request.seed, ready.round))
        costs = [float(len(self.data[device.me].train)) for device, _ in batch]

        def report(index: int, trained: Trained) -> None:
            """On the thread that trained it (its device's alone): encode, hand on, report."""
            device, ready = batch[index]
            request = ready.request
            assert isinstance(request, TrainRequest) and ready.weights is not None
            try:
                if trained.outcome is None:
                    device.runner.report_failed(request, ready.round, trained.failure)
                else:
                    device.runner.report_trained(request, ready.round, ready.weights, trained.outcome, key=ready.key)
            except CoveyError as exc:  # as the agent drops it: this task's output is lost, the run goes on
                failures.append(f"{device.me} {request.task_id}: {exc}")

        failures: list[str] = []
        self.train(calls, costs, report)
        for failure in failures:
            self.dropped += 1
            log.warning("simulation: a device could not report %s", failure)
        for device, _ in batch:
            self._take_outbox(device)


@dataclass(frozen=True)
class _Publisher:
    """How the managers (``sender`` = the server) or one virtual device publish: the bus
    knows who sent what, as a broker does from the client's topic rights. A
    :class:`~device.protocol.Carrier`: models in ``carries`` go whole."""

    sender: str
    carries: frozenset[FrameCodec]
    put: Callable[[_Delivery], None]
    # only fp32 runs carry models whole, and nothing in them names a model by its hash
    # (no delta, no base): the header holds a unique token (whole_payload's ``hashed``)
    hashes: bool = False

    def __call__(self, topic: str, data: bytes, retain: bool) -> None:
        self.put(_Delivery(topic, self.sender, data=data, size=len(data) if _is_frame(topic) else 0, retain=retain))

    def carry(self, topic: str, payload: Payload, size: int, retain: bool) -> None:
        self.put(_Delivery(topic, self.sender, payload=payload, size=size, retain=retain))


def _is_frame(topic: str) -> bool:
    """Whether ``topic`` carries model frames (what is counted on the wire)."""
    return "/frames" in topic or "/shared/" in topic
