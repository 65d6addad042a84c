"""The conformance kit's tools for its scenarios (:mod:`server.conformance_checks`):
send a request or a model as a coordinator would, and wait for what the protocol says
must come back."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from device.protocol import (
    SERVER_ID,
    FrameExtra,
    FrameHeader,
    FrameKind,
    LocalTraining,
    ManagerHop,
    Ping,
    Pong,
    TrainRequest,
    TrainResult,
)
from server.conformance_session import ProbeSession

TRAIN = LocalTraining(1, 5, 0.01)
QUIET_S = 3.0  # how long a device has to show it ignored bad input
AT_ONCE_S = 3.0  # result message after the output frames
Output = tuple[FrameHeader, np.ndarray, float]


class ScenarioTools:
    """What every scenario uses: requests and models sent as a coordinator would, and
    waits for what must come back (outputs, results, a pong, a quiet period)."""

    def __init__(self, kit: ProbeSession) -> None:
        self.kit, self.t = kit, kit.topics
        self.me = kit.device
        self.n_params = kit.manifest.n_params
        self.start = kit.start_weights
        self.gaps: list[float] = []  # seconds from output frames to result message
        self.train_results: list[TrainResult] = []  # every train result a scenario waited for

    # -- helpers ------------------------------------------------------------------------
    def output(self, since: int, topic: str, task_id: str, kind: str, timeout: float | None = None) -> Output | None:
        def find(i: int) -> Output | None:
            return next(
                (p for p in self.kit.payloads(i, topic) if p[0].extra.task_id == task_id and p[0].kind == kind), None
            )

        found: Any = self.kit.wait_for(find, timeout, since)
        return found

    def result(self, since: int, task_id: str, kind: type, timeout: float | None = None) -> tuple[Any, float] | None:
        def find(i: int) -> tuple[Any, float] | None:
            return next(
                (
                    (m.body, at)
                    for m, at in self.kit.messages(i, "results")
                    if isinstance(m.body, kind) and getattr(m.body, "task_id", None) == task_id
                ),
                None,
            )

        found: Any = self.kit.wait_for(find, timeout, since)
        if found is not None and isinstance(found[0], TrainResult):
            self.train_results.append(found[0])
        return found

    def train(self, task: str, *, rnd: int = 1, **fields: Any) -> TrainRequest:
        request = TrainRequest(
            task,
            fields.pop("group", 0),
            fields.pop("position", 0),
            fields.pop("mode", "parallel"),
            fields.pop("predecessor", SERVER_ID),
            fields.pop("next", ManagerHop(0)),
            TRAIN,
            seed=1,
            **fields,
        )
        self.kit.request(request, rnd)
        return request

    def send(self, weights: np.ndarray, task: str, *, sender: str = SERVER_ID, rnd: int = 1, index: int = 0) -> None:
        topic = self.t.frames(self.me) if sender == SERVER_ID else self.t.handoff(self.me, sender)
        kind: FrameKind = "model" if sender == SERVER_ID else "handoff"
        self.kit.send_frames(
            weights, topic, kind=kind, sender=sender, rnd=rnd, extra=FrameExtra(task, index=index, position=0)
        )

    def trained(self, out: Output | None) -> str:
        """Why an output is not a trained model ("" if it is one)."""
        if out is None:
            return "no output arrived"
        _, arr, _ = out
        if arr.shape != (self.n_params,) or not np.isfinite(arr).all():
            return f"output of shape {arr.shape} or not finite"
        return "the output equals the start model: nothing was trained" if np.array_equal(arr, self.start) else ""

    def note_gap(self, out: Output | None, res: tuple[Any, float] | None) -> None:
        if out is not None and res is not None:
            self.gaps.append(res[1] - out[2])
        elif out is not None:
            self.gaps.append(float("inf"))

    def quiet(self, since: int, topic: str, task: str, kind: str) -> bool:
        return self.output(since, topic, task, kind, timeout=QUIET_S) is None

    def handled(self, timeout: float = 10.0) -> bool:
        """Wait until the device has handled every inbox message sent so far: a device
        handles its inbox in order, so its pong to a ping sent now comes after that.
        A chain member subscribes to its predecessor's hand-off topic when it handles
        the request (docs/protocol.md, "Hand-offs"); a predecessor publishes after."""
        since, t = len(self.kit.seen), time.time()
        self.kit.request(Ping(t), 0)
        pong = self.kit.wait_for(
            lambda i: next(
                (m for m, _ in self.kit.messages(i, "results") if isinstance(m.body, Pong) and m.body.echo == t),
                None,
            ),
            timeout,
            since,
        )
        return pong is not None
