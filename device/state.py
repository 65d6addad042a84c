"""What a device keeps on disk between restarts, written atomically.

``state.json`` holds the device id, the run and the ids of the tasks it finished (the
last 500, so a redelivered request is not trained twice). Every finished training
result is *held* until the coordinator acknowledges it (``ack``): its output model
in ``held/<task>.npy`` and, in ``held/<task>.json``, where it went (round, group,
position, destination) and the result message. A held result is delivered again
when the same request arrives again (a resumed coordinator re-issues its round), when
a new coordinator appears, after a reconnect, and on ``resend``; so a restart of the
coordinator, the broker or the device loses no trained work. Files are written to a
temporary name, flushed and renamed: a power cut leaves the old state or the new one.
"""

from __future__ import annotations

import io
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("covey.device")
KEEP_TASKS = 500
KEEP_HELD = 16  # results never acknowledged (an old server) do not fill the disk


def atomic_write(path: Path, data: bytes) -> None:
    """Write, fsync, rename: readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class HeldResult:
    """A finished training task the coordinator has not acknowledged yet."""

    task_id: str
    round: int
    group: int
    position: int
    to: dict[str, Any]  # the destination's body (a DeviceHop or ManagerHop)
    message: bytes  # the encoded result message, sent again as it was
    weights: np.ndarray = field(repr=False)


@dataclass
class AgentState:
    """A device's finished tasks and held results; ``persist=False`` keeps them in memory
    only (a simulated device, which no restart can lose)."""

    directory: Path
    done_tasks: list[str] = field(default_factory=list)
    held: dict[str, HeldResult] = field(default_factory=dict)
    persist: bool = True

    @property
    def _file(self) -> Path:
        return self.directory / "state.json"

    @property
    def _held_dir(self) -> Path:
        return self.directory / "held"

    def load(self) -> None:
        if self._file.exists():
            try:
                state = json.loads(self._file.read_text())
                self.done_tasks = [str(t) for t in state.get("done_tasks", [])][-KEEP_TASKS:]
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                log.warning("%s: ignoring an unreadable state file (%s)", self.directory, exc)
        for meta in sorted(self._held_dir.glob("*.json")) if self._held_dir.is_dir() else []:
            try:
                raw = json.loads(meta.read_text())
                weights = np.load(meta.parent / f"{meta.name[: -len('.json')]}.npy", allow_pickle=False)
                held = HeldResult(
                    str(raw["task_id"]),
                    int(raw["round"]),
                    int(raw["group"]),
                    int(raw["position"]),
                    dict(raw["to"]),
                    str(raw["message"]).encode(),
                    weights,
                )
                self.held[held.task_id] = held
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("%s: ignoring an unreadable held result %s (%s)", self.directory, meta.name, exc)
        if self.done_tasks or self.held:
            log.info(
                "%s: resumed (%d finished tasks, %d results held)",
                self.directory.name,
                len(self.done_tasks),
                len(self.held),
            )

    def finished(self, task_id: str) -> None:
        if task_id not in self.done_tasks:
            self.done_tasks.append(task_id)
            del self.done_tasks[:-KEEP_TASKS]

    def is_done(self, task_id: str) -> bool:
        return task_id in self.done_tasks

    def hold(self, result: HeldResult) -> None:
        """Keep ``result`` on disk until acknowledged (the oldest beyond a few go)."""
        if self.persist:
            buffer = io.BytesIO()
            np.save(buffer, result.weights, allow_pickle=False)
            atomic_write(self._held_dir / f"{result.task_id}.npy", buffer.getvalue())
            meta = {
                "task_id": result.task_id,
                "round": result.round,
                "group": result.group,
                "position": result.position,
                "to": result.to,
                "message": result.message.decode(),
            }
            atomic_write(self._held_dir / f"{result.task_id}.json", json.dumps(meta).encode())
        self.held[result.task_id] = result
        while len(self.held) > KEEP_HELD:
            self.forget([min(self.held.values(), key=lambda h: h.round).task_id])

    def forget(self, task_ids: list[str] | tuple[str, ...]) -> int:
        """Drop acknowledged results; returns how many were held."""
        n = 0
        for task_id in task_ids:
            if self.held.pop(task_id, None) is not None:
                n += 1
                for suffix in (".json", ".npy") if self.persist else ():
                    (self._held_dir / f"{task_id}{suffix}").unlink(missing_ok=True)
        return n

    def save(self, device_id: str, run: str) -> None:
        if not self.persist:
            return
        state = {"device_id": device_id, "run": run, "done_tasks": self.done_tasks}
        atomic_write(self._file, json.dumps(state).encode())
