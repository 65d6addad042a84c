"""The work a device does for a request, and the replies it sends.

:class:`TaskRunner` computes with ``device/training.py`` (the code the simulator
runs too) and answers in the protocol's order: a trained model goes to the successor
(direct hand-off) or the group manager, and the ``result`` message follows at once;
a trained model goes in the codec the request names (an ``int8`` delta against the
model that arrived, with this device's error feedback, ``device/protocol/codecs.py``);
a pre-training reply is one ``update`` frame, then a ``pretrain`` result; an
evaluation is one ``evaluate`` result. A training result is held on disk until the
coordinator acknowledges it (``device/state.py``) and delivered again when asked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from device import board
from device.data import Dataset, class_counts
from device.errors import ProtocolError
from device.protocol import (
    DELTA_CODECS,
    DeviceHop,
    ErrorFeedback,
    EvaluateRequest,
    EvaluateResult,
    FrameCodec,
    FrameExtra,
    FrameKind,
    Hop,
    InboundTransfer,
    Message,
    PretrainRequest,
    PretrainResult,
    Publish,
    ResendRequest,
    Topics,
    TrainFailed,
    TrainRequest,
    TrainResult,
    encode_output,
    send_model,
)
from device.protocol.typed import read_value, to_body
from device.runtime import TFLiteModel
from device.state import AgentState, HeldResult
from device.training import TrainOutcome, evaluate_locally, pretrain_locally, train_locally

log = logging.getLogger("covey.device")
Send = Callable[[Any, int], None]
InWorker = Callable[..., Any]


class TaskRunner:
    """One device's computation and replies; the agent decides when to call it."""

    def __init__(
        self,
        me: str,
        topics: Topics,
        model: TFLiteModel,
        train_data: Dataset,
        test_data: Dataset | None,
        state: AgentState,
        *,
        publish: Publish,
        send: Send,
        in_worker: InWorker,
        max_chunk: int,
    ) -> None:
        self.me, self.topics, self.run = me, topics, topics.run
        self.model, self.train_data, self.test_data, self.state = model, train_data, test_data, state
        self._publish, self._send, self._in_worker, self.max_chunk = publish, send, in_worker, max_chunk
        self.trained = 0
        self.feedback = ErrorFeedback()  # the residual of this device's last int8 output

    def train(
        self,
        request: TrainRequest,
        rnd: int,
        weights: np.ndarray,
        key: str = "",
        inbound: InboundTransfer | None = None,
        exclusive: bool = False,
    ) -> None:
        """Train, hand the output on, then report at once (the server waits on both).

        ``key``: the sha256 of the payload ``weights`` came in (the base an ``int8``
        output names); ``inbound``: how fast it arrived, reported with the result;
        ``exclusive``: no other task holds ``weights``, so training may write into them."""
        start = time.perf_counter()
        # nothing needs the start model after training unless another task holds it, an
        # int8 output is a delta against it or the server's next start model will be
        # (unless it says discard_start): otherwise the result takes its buffer, one model
        # less at the peak
        reuse = exclusive and request.codec not in DELTA_CODECS and request.discard_start
        peak = board.PeakMemory()
        peak.reset()
        out = self._in_worker(
            train_locally,
            self.model,
            self.train_data,
            request.train,
            start=weights,
            seed=request.seed,
            rnd=rnd,
            device_id=self.me,
            reuse_start=reuse,
        )
        self.report_trained(
            request, rnd, weights, out, key=key, inbound=inbound, seconds=time.perf_counter() - start, peak=peak
        )

    def report_trained(
        self,
        request: TrainRequest,
        rnd: int,
        weights: np.ndarray,
        out: TrainOutcome,
        *,
        key: str = "",
        inbound: InboundTransfer | None = None,
        seconds: float = 0.0,
        peak: board.PeakMemory | None = None,
    ) -> None:
        """The second half of :meth:`train`: hand ``out`` (trained from ``weights``) on,
        report it, and hold it until acknowledged. The simulator calls it for work its
        own workers trained (``server/simulation/virtual_bus.py``); ``peak``: the memory
        high-water mark since training started (None: no board telemetry)."""
        self.trained += 1
        self.state.finished(request.task_id)
        delivered = time.perf_counter()
        encoded, codec = encode_output(out.weights, weights, request.codec, self.feedback)
        base = key if codec in DELTA_CODECS else None
        self.deliver(encoded, request.task_id, rnd, request.group, request.position, request.next, codec, base)
        result = TrainResult(
            task_id=request.task_id,
            n_samples=out.n_samples,
            loss=out.loss if out.n_samples else 0.0,  # no data, no loss (NaN cannot travel); weight 0
            steps=out.steps,
            group=request.group,
            position=request.position,
            class_counts=tuple(int(c) for c in class_counts(self.train_data.y, self.model.manifest.n_classes)),
            train_seconds=seconds,
            deliver_seconds=time.perf_counter() - delivered,
            inbound=inbound,
            telemetry=board.telemetry(peak) if peak is not None else None,
        )
        message = Message.of(result, run=self.run, sender=self.me, round=rnd).encode()
        self._publish(self.topics.results(self.me), message, False)  # at once after the frames
        # held until the coordinator acknowledges it; off the round's critical path
        held = HeldResult(
            request.task_id, rnd, request.group, request.position, to_body(request.next), message, out.weights
        )
        self.state.hold(held)
        self.state.save(self.me, self.run)
        log.info(
            "%s: round %d group %d position %d trained %d samples, loss %.3f (%.1f s)",
            self.me,
            rnd,
            request.group,
            request.position,
            out.n_samples,
            out.loss,
            seconds,
        )

    def report_failed(self, request: TrainRequest, rnd: int, detail: str) -> None:
        """Tell the server that training ``request`` diverged (no model follows), so its
        group goes on without this device at once instead of at its deadline."""
        body = TrainFailed(request.task_id, "diverged", detail[:300])
        message = Message.of(body, run=self.run, sender=self.me, round=rnd).encode()
        self._publish(self.topics.results(self.me), message, False)

    def redeliver(self, task_id: str, to: Hop | None = None) -> bool:
        """Deliver a held result again (its model to ``to`` or where it went first, then
        its result message); False if nothing is held for ``task_id``."""
        held = self.state.held.get(task_id)
        if held is None:
            return False
        hop = to if to is not None else read_value(Hop, held.to, "held destination")
        self.deliver(held.weights, task_id, held.round, held.group, held.position, hop)
        self._publish(self.topics.results(self.me), held.message, False)
        log.info("%s: delivered the held result of %s again", self.me, task_id)
        return True

    def redeliver_all(self) -> int:
        """Every result not yet acknowledged, oldest round first (after a reconnect or
        when a new coordinator appears)."""
        held = sorted(self.state.held.values(), key=lambda h: h.round)
        return sum(self.redeliver(h.task_id) for h in held)

    def deliver(
        self,
        payload: np.ndarray,
        task_id: str,
        rnd: int,
        group: int,
        position: int,
        to: Hop,
        codec: FrameCodec = "raw",
        base: str | None = None,
    ) -> None:
        """Send a trained model on: to the successor (direct) or the group manager.

        ``payload`` is encoded by ``codec``; a held result goes again as raw float32
        (the base of a delta may be gone by then)."""
        kind: FrameKind
        if isinstance(to, DeviceHop):  # the frame names the task it is for: the successor's
            topic, kind, for_task = self.topics.handoff(to.device, self.me), "handoff", to.task_id
        else:
            topic, kind, for_task = self.topics.uploads(self.me), "result", task_id
        send_model(
            self._publish,
            topic,
            payload,
            kind=kind,
            run=self.run,
            round=rnd,
            group=group,
            sender=self.me,
            max_chunk=self.max_chunk,
            extra=FrameExtra(for_task, position=position),
            codec=codec,
            base=base,
        )

    def resend(self, request: ResendRequest) -> None:
        """The manager lost a hand-off (a successor missed its deadline): send the held
        output again, to the destination the request names."""
        held = self.state.held.get(request.task_id)
        if held is None:
            raise ProtocolError(
                f"resend of task {request.task_id!r}, for which this device holds no output (acknowledged or unknown)"
            )
        self.deliver(held.weights, request.task_id, held.round, held.group, held.position, request.to)

    def pretrain(self, request: PretrainRequest, rnd: int, weights: np.ndarray) -> None:
        """Pre-train; reply with the ``update`` frame, then the result message."""
        update, out = self._in_worker(
            pretrain_locally,
            self.model,
            self.train_data,
            steps=request.steps,
            batch=request.batch,
            lr=request.lr,
            start=weights,
            seed=request.seed,
            rnd=rnd,
            device_id=self.me,
        )
        self.state.finished(request.task_id)
        send_model(
            self._publish,
            self.topics.uploads(self.me),
            update,
            kind="update",
            run=self.run,
            round=rnd,
            group=-1,
            sender=self.me,
            max_chunk=self.max_chunk,
            extra=FrameExtra(request.task_id),
        )
        self._send(PretrainResult(request.task_id, out.n_samples, out.loss, out.steps), rnd)

    def evaluate(self, request: EvaluateRequest, rnd: int, models_by_index: dict[int, np.ndarray]) -> None:
        if request.split == "train":
            split = self.train_data
        else:  # without a test set the device reports zero test samples
            split = self.test_data or Dataset(self.train_data.x[:0], self.train_data.y[:0])
        models = [models_by_index[i] for i in range(request.n_models)]
        rows = self._in_worker(evaluate_locally, self.model, split, models)
        self.state.finished(request.task_id)
        self._send(EvaluateResult(request.task_id, tuple(rows)), rnd)
