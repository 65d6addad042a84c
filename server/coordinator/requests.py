"""Pre-training and evaluation requests to devices over MQTT, and their replies.

The round driver asks for these while a strategy plans (FedGroup's cold start,
IFCA's losses) and when it scores clients. Every request carries a task id unique to
this coordinator process; a reply is accepted only from the device the task went to
(the sender is taken from the topic). Several devices that need the same model get
it as one shared, retained copy on the broker (``shared.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count

import numpy as np

from device.protocol import (
    SERVER_ID,
    EvalRow,
    EvaluateRequest,
    EvaluateResult,
    FrameExtra,
    Message,
    PretrainRequest,
    Publish,
    Result,
    Topics,
    send_model,
)
from server.backend import EvalJob
from server.execution.shared import SharedModels

log = logging.getLogger("covey.server")


@dataclass
class _Pending:
    device: str
    update: np.ndarray | None = field(default=None, repr=False)
    result: Result | None = None


class TaskRequests:
    """Issues requests, collects replies, waits with a deadline (never forever)."""

    def __init__(
        self,
        topics: Topics,
        publish: Publish,
        shared: SharedModels,
        pump: Callable[[float], None],
        *,
        deadline_s: float,
        max_chunk: int,
        task_prefix: str,
        run_events: list[dict[str, object]] | None = None,
    ) -> None:
        self.topics, self.publish, self.shared, self.pump = topics, publish, shared, pump
        # where a request no device answered is noted, for people (results.json, the dashboard)
        self.run_events = run_events if run_events is not None else []
        self.deadline_s, self.max_chunk, self.task_prefix = deadline_s, max_chunk, task_prefix
        self.pending: dict[str, _Pending] = {}
        self._ids = count()

    # -- replies ----------------------------------------------------------------------------
    def on_result(self, device: str, result: Result) -> bool:
        """A ``pretrain`` or ``evaluate`` result; False if no request of ours waits for it."""
        p = self.pending.get(result.task_id)
        if p is None or p.device != device:
            return False
        p.result = result
        return True

    def on_update(self, device: str, task_id: str, update: np.ndarray) -> bool:
        p = self.pending.get(task_id)
        if p is None or p.device != device:
            return False
        p.update = update
        return True

    # -- requests ----------------------------------------------------------------------------
    def _task_id(self, kind: str, rnd: int) -> str:
        return f"{self.task_prefix}-{kind}{next(self._ids)}-r{rnd}"

    def _issue(
        self, kind: str, client_ids: Sequence[str], models: Sequence[np.ndarray], rnd: int, make: Callable[..., object]
    ) -> tuple[dict[str, str], list[str]]:
        """Send ``make(task_id, shared)`` with ``models`` to every client."""
        shared = (
            [self.shared.publish(m, round_=rnd, group=-1, label=f"{kind}{i}") for i, m in enumerate(models)]
            if len(client_ids) > 1
            else []
        )
        tasks = {}
        for c in client_ids:
            task_id = self._task_id(kind, rnd)
            tasks[task_id] = c
            self.pending[task_id] = _Pending(c)
            body = make(task_id, tuple(shared))
            self.publish(
                self.topics.inbox(c), Message.of(body, run=self.topics.run, sender=SERVER_ID, round=rnd).encode(), False
            )
            for i, m in enumerate(models if not shared else ()):
                send_model(
                    self.publish,
                    self.topics.frames(c),
                    m,
                    kind="model",
                    run=self.topics.run,
                    round=rnd,
                    group=-1,
                    sender=SERVER_ID,
                    max_chunk=self.max_chunk,
                    extra=FrameExtra(task_id, index=i),
                )
        return tasks, shared

    def _wait(
        self, tasks: dict[str, str], done: Callable[[_Pending], bool], what: str, rnd: int
    ) -> dict[str, _Pending]:
        """Pump until every task is done or the deadline passes; replies by task id. The
        devices that did not answer are logged and noted in :attr:`run_events`."""
        deadline = time.monotonic() + self.deadline_s
        while time.monotonic() < deadline and not all(done(self.pending[t]) for t in tasks):
            self.pump(0.1)
        out = {t: self.pending.pop(t) for t in tasks}
        missing = sorted({p.device for p in out.values() if not done(p)})
        if missing:
            log.warning("%s: no reply from %s before the deadline", what, missing)
            for device in missing:
                self.run_events.append({"round": rnd, "kind": "no reply", "device": device, "detail": what})
        return out

    def pretrain(
        self, client_ids: Sequence[str], weights: np.ndarray, *, steps: int, batch: int, lr: float, seed: int, rnd: int
    ) -> dict[str, np.ndarray]:
        tasks, shared = self._issue(
            "pretrain",
            client_ids,
            [weights],
            rnd,
            lambda task_id, keys: PretrainRequest(task_id, steps, batch, float(lr), seed, keys),
        )
        try:
            # the protocol's reply is the update frame, then the result message: wait for both
            replies = self._wait(tasks, lambda p: p.update is not None and p.result is not None, "pretrain", rnd)
        finally:
            self.shared.clear(*shared)
        return {p.device: p.update for p in replies.values() if p.update is not None}

    def evaluate(self, jobs: Sequence[EvalJob], *, rnd: int) -> list[dict[str, list[EvalRow]]]:
        issued = []
        shared_all: list[str] = []
        try:
            for job in jobs:
                n = len(job.models)
                tasks, shared = self._issue(
                    "evaluate",
                    job.clients,
                    job.models,
                    rnd,
                    lambda task_id, keys, n=n, split=job.split: EvaluateRequest(task_id, n, split, keys),
                )
                issued.append(tasks)
                shared_all += shared
            everything = {t: c for tasks in issued for t, c in tasks.items()}
            replies = self._wait(everything, lambda p: isinstance(p.result, EvaluateResult), "evaluate", rnd)
        finally:
            self.shared.clear(*shared_all)
        out: list[dict[str, list[EvalRow]]] = []
        for tasks, job in zip(issued, jobs, strict=True):
            rows: dict[str, list[EvalRow]] = {}
            for task_id, c in tasks.items():
                result = replies[task_id].result
                if isinstance(result, EvaluateResult) and sorted(r.index for r in result.evaluations) == list(
                    range(len(job.models))
                ):
                    rows[c] = sorted(result.evaluations, key=lambda r: r.index)
            out.append(rows)
        return out
