"""covey's agent, broken on purpose in six ways a third-party device got wrong.

1. Its frames carry ``"group": null`` (the protocol's ``group`` is an integer, -1 for
   none).
2. It sends each train result 4 s after its output frames (as if it waited for the
   broker's acknowledgement first), not at once.
3. It answers ``pretrain`` with the trained weights instead of trained minus start,
   and sends no result message.
4. Its registration lists only ``raw`` among its codecs, as if it could not decode the
   fp16 and int8 models every version-2 device gets.
5. It says nothing about itself: no platform in its registration, no telemetry in its
   train results (as agents from before them).
6. It forgets its results once sent: a new coordinator (after ``--resume``) never gets
   them again, and the round waits out a deadline.

Run like covey-device: ``python tests/mqtt/broken_agent.py --broker ... --run ... --id ...``.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from device import agent, board, cli, tasks
from device.protocol import FrameExtra, send_model
from device.protocol import frames as frames_module
from device.training import pretrain_locally

_encode = frames_module.encode_frames


def _null_group(array: np.ndarray, **kwargs: Any) -> Iterator[bytes]:
    for frame in _encode(array, **kwargs):
        (n,) = struct.unpack("<I", frame[4:8])
        header = json.loads(frame[8 : 8 + n])
        header["group"] = None
        head = json.dumps(header).encode()
        yield frame[:4] + struct.pack("<I", len(head)) + head + frame[8 + n :]


_train = tasks.TaskRunner.train


def _late_train(self: tasks.TaskRunner, request: Any, rnd: int, weights: np.ndarray, *rest: Any) -> None:
    publish = self._publish

    def late(topic: str, payload: bytes, retain: bool) -> None:
        if topic == self.topics.results(self.me):  # the train result message
            time.sleep(4.0)
        publish(topic, payload, retain)

    self._publish = late
    try:
        _train(self, request, rnd, weights, *rest)  # rest: whatever else the runner takes (the payload key)
    finally:
        self._publish = publish


def _wrong_pretrain(self: tasks.TaskRunner, request: Any, rnd: int, weights: np.ndarray) -> None:
    _, out = self._in_worker(
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
    send_model(
        self._publish,
        self.topics.uploads(self.me),
        out.weights,
        kind="update",
        run=self.run,
        round=rnd,
        group=-1,
        sender=self.me,
        extra=FrameExtra(request.task_id),
    )


frames_module.encode_frames = _null_group  # type: ignore[assignment]
agent.FRAME_CODECS = ("raw",)  # type: ignore[attr-defined]
agent.Agent._redeliver_held = lambda self, why: None  # type: ignore[method-assign]
tasks.TaskRunner.train = _late_train  # type: ignore[method-assign]
tasks.TaskRunner.pretrain = _wrong_pretrain  # type: ignore[method-assign]
board.describe = lambda backend, version: None  # type: ignore[assignment,return-value]
board.telemetry = lambda peak: None  # type: ignore[assignment,return-value]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
