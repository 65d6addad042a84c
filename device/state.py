"""What a device keeps on disk between restarts, written atomically.

``state.json`` holds the device id, the run, the ids of the tasks it finished (the
last 500, so a redelivered request is not trained twice) and the request of its last
output; ``last_output.npy`` holds that output, so a restarted agent can still answer
a ``resend`` for work it finished before the restart. Both are written to a
temporary file, flushed and renamed: a power cut leaves the old state or the new one.
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


def atomic_write(path: Path, data: bytes) -> None:
    """Write, fsync, rename: readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@dataclass
class AgentState:
    directory: Path
    done_tasks: list[str] = field(default_factory=list)
    last_output: np.ndarray | None = None
    last_output_task: dict[str, Any] | None = None  # {"task_id", "round", "group", "position"}

    @property
    def _file(self) -> Path:
        return self.directory / "state.json"

    @property
    def _output_file(self) -> Path:
        return self.directory / "last_output.npy"

    def load(self) -> None:
        if not self._file.exists():
            return
        try:
            state = json.loads(self._file.read_text())
            self.done_tasks = [str(t) for t in state.get("done_tasks", [])][-KEEP_TASKS:]
            if self._output_file.exists():
                self.last_output = np.load(self._output_file, allow_pickle=False)
                self.last_output_task = state.get("last_output_task")
            log.info("%s: resumed (%d finished tasks on record)", self.directory.name, len(self.done_tasks))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("%s: ignoring an unreadable state file (%s)", self.directory, exc)

    def finished(self, task_id: str) -> None:
        if task_id not in self.done_tasks:
            self.done_tasks.append(task_id)
            del self.done_tasks[:-KEEP_TASKS]

    def is_done(self, task_id: str) -> bool:
        return task_id in self.done_tasks

    def save(self, device_id: str, run: str) -> None:
        state = {
            "device_id": device_id,
            "run": run,
            "done_tasks": self.done_tasks,
            "last_output_task": self.last_output_task,
        }
        if self.last_output is not None:
            buffer = io.BytesIO()
            np.save(buffer, self.last_output, allow_pickle=False)
            atomic_write(self._output_file, buffer.getvalue())
        atomic_write(self._file, json.dumps(state).encode())
