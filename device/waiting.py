"""Requests a device accepted and the models they wait for.

A request waits until its model arrives: from the server (``device/<id>/frames``), as
a shared model, or from its predecessor (a direct hand-off). :class:`WaitingTasks`
checks every arriving model against the request it claims to be for — the round, who
may send it (the server, or the request's predecessor), the model index of an
evaluation — and hands back the tasks that can now run. It keeps no network state;
the agent subscribes to the shared keys it names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from device.errors import ProtocolError
from device.protocol import (
    SERVER_ID,
    EvaluateRequest,
    InboundTransfer,
    Payload,
    PretrainRequest,
    TrainRequest,
    check_weights,
)

Request = TrainRequest | PretrainRequest | EvaluateRequest


def inbound_of(payload: Payload) -> InboundTransfer | None:
    """What the coordinator learns from how fast ``payload`` arrived (its sender, the
    bytes after its first chunk and their seconds); ``None`` for a payload of one chunk
    or one whose chunks arrived too close together to time."""
    t = payload.timing
    if t is None or t.goodput_bps is None or t.nbytes <= 0:
        return None
    try:
        return InboundTransfer(payload.header.sender, t.nbytes, t.seconds)
    except ValueError:  # faster than any link (1 Tbit/s) or slower than an hour: not a measurement
        return None


@dataclass
class Ready:
    """A task whose model(s) arrived: run it."""

    request: Request
    round: int
    weights: np.ndarray | None = field(default=None, repr=False)  # train / pretrain
    key: str = ""  # the sha256 of the payload the weights came in: the base of an int8 output
    inbound: InboundTransfer | None = None  # how fast that payload arrived, when it could be timed
    exclusive: bool = True  # no other task got the same array (a shared model may serve several)
    models: dict[int, np.ndarray] = field(default_factory=dict, repr=False)  # evaluate: index -> model


@dataclass
class _Task:
    request: Request
    round: int
    models: dict[int, np.ndarray] = field(default_factory=dict)


class WaitingTasks:
    """Waiting requests, and the last model the server sent for a training task whose
    request does not say ``discard_start`` (the base of the server's next ``int8`` downlink delta,
    ``server/downlink.py``): kept by reference, it is the start model the device trains
    from, not an extra copy."""

    def __init__(self) -> None:
        self._tasks: dict[str, _Task] = {}
        self.held: dict[str, np.ndarray] = {}  # at most one: payload sha256 -> model

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def add(self, request: Request, rnd: int) -> None:
        self._tasks[request.task_id] = _Task(request, rnd)

    def clear(self) -> None:
        self._tasks.clear()

    def predecessors(self) -> set[str]:
        """Devices that may hand a model straight to a waiting train request."""
        return {
            t.request.predecessor
            for t in self._tasks.values()
            if isinstance(t.request, TrainRequest) and t.request.predecessor != SERVER_ID
        }

    def shared_keys(self) -> set[str]:
        """Shared models some waiting task still needs."""
        return {k for task in self._tasks.values() for k in task.request.shared}

    def accept(self, payload: Payload, n_params: int) -> list[Ready]:
        """Match a complete model payload to the task(s) it is for; the tasks that can
        run now. Raises :class:`ProtocolError` for a model nobody may send or wait for."""
        h = payload.header
        if h.kind not in ("model", "handoff"):
            raise ProtocolError(f"devices accept model and handoff frames, not {h.kind!r}")
        if h.extra.shared is not None:
            if h.sender != SERVER_ID:
                raise ProtocolError(f"shared model from {h.sender!r}")
            targets = [
                (tid, t, t.request.shared.index(h.extra.shared))
                for tid, t in self._tasks.items()
                if h.extra.shared in t.request.shared
            ]
        else:
            task = self._tasks.get(h.extra.task_id or "")
            if task is None:
                raise ProtocolError(f"model frame for task {h.extra.task_id!r}, which this device is not waiting for")
            targets = [(h.extra.task_id or "", task, h.extra.index)]
        ready = []
        for task_id, task, index in targets:
            if h.round != task.round:
                raise ProtocolError(f"model frame for round {h.round}, task is in round {task.round}")
            request = task.request
            allowed = {SERVER_ID, request.predecessor} if isinstance(request, TrainRequest) else {SERVER_ID}
            if h.sender not in allowed:
                raise ProtocolError(f"model from {h.sender!r}, expected one of {sorted(allowed)}")
            weights = check_weights(payload, n_params, self.held)
            if isinstance(request, EvaluateRequest):
                if index >= request.n_models:
                    raise ProtocolError(f"model index {index} of an evaluate request for {request.n_models} models")
                task.models[index] = weights
                if len(task.models) == request.n_models:
                    del self._tasks[task_id]
                    ready.append(Ready(request, task.round, models=task.models))
                continue
            del self._tasks[task_id]
            if isinstance(request, TrainRequest) and h.sender == SERVER_ID:
                # the base of the server's next int8 delta; in other runs nothing to keep
                # (and the task may train into the buffer: device/tasks.py)
                self.held = {} if request.discard_start else {h.sha256: weights}
            ready.append(
                Ready(
                    request,
                    task.round,
                    weights=weights,
                    key=h.sha256,
                    inbound=inbound_of(payload),
                    exclusive=len(targets) == 1,
                )
            )
        return ready
