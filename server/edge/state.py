"""What an edge keeps on disk, so that a restarted edge goes on with its groups.

``edge.json`` lists the tasks the edge was running or waiting to start, and the reports
of the tasks it finished (a coordinator that asks again gets the same answer); each model
those name is a file ``models/<sha256>.npy`` named by its float32 bytes' digest. Every
file is written whole to a temporary name and renamed (``device.state.atomic_write``),
models before the list that names them, so a crash at any point leaves the old state or
the new one. Nothing is unpickled: JSON bodies checked like messages, and ``.npy`` files
read with ``allow_pickle=False`` whose digest must match their name.

A restarted edge starts its tasks again with the same task ids: the members that had
trained deliver the results they hold (a board keeps a result until the coordinator
acknowledges it, ``device/tasks.py``), so no contribution is lost and none is counted twice.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np

from device.errors import ConfigError, ProtocolError
from device.protocol.typed import from_body, to_body
from device.state import atomic_write
from server.edge.messages import EdgeReport, EdgeTask
from server.edge.proxy import model_key

log = logging.getLogger("covey.edge")
STATE_FILE = "edge.json"


class EdgeState:
    """The edge's tasks, finished reports and models in ``directory`` (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.models_dir = directory / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)

    def save_model(self, weights: np.ndarray) -> str:
        key = model_key(weights)
        path = self.models_dir / f"{key}.npy"
        if not path.exists():
            buffer = io.BytesIO()
            np.save(buffer, np.asarray(weights, np.float32), allow_pickle=False)
            atomic_write(path, buffer.getvalue())
        return key

    def save(self, tasks: list[EdgeTask], finished: list[tuple[EdgeReport, str | None]]) -> None:
        """The tasks in flight and the finished reports (with their model's key); models
        no entry names any more are removed afterwards."""
        doc = {
            "tasks": [to_body(t) for t in tasks],
            "finished": [{"report": to_body(r), "model": key} for r, key in finished],
        }
        atomic_write(self.directory / STATE_FILE, json.dumps(doc).encode())
        named = {t.model for t in tasks} | {key for _, key in finished if key is not None}
        for path in self.models_dir.glob("*.npy"):
            if path.stem not in named:
                path.unlink(missing_ok=True)

    def load_model(self, key: str) -> np.ndarray | None:
        path = self.models_dir / f"{key}.npy"
        if not path.exists():
            return None
        weights = np.load(path, allow_pickle=False)
        if weights.dtype != np.float32 or weights.ndim != 1 or model_key(weights) != key:
            log.warning("%s is not the model its name says; left out", path)
            return None
        return weights

    def load(self) -> tuple[list[EdgeTask], list[tuple[EdgeReport, np.ndarray | None]]]:
        """The tasks and finished reports saved last (none on a first start)."""
        path = self.directory / STATE_FILE
        if not path.exists():
            return [], []
        try:
            doc = json.loads(path.read_text())
            tasks = [from_body(EdgeTask, raw, "saved task") for raw in doc["tasks"]]
            finished = []
            for entry in doc["finished"]:
                report = from_body(EdgeReport, entry["report"], "saved report")
                key = entry["model"]
                model = None if key is None else self.load_model(str(key))
                if key is None or model is not None:
                    finished.append((report, model))
        except (OSError, ValueError, KeyError, TypeError, ProtocolError) as exc:
            raise ConfigError(f"{path} cannot be read ({exc}); remove it to start the edge afresh") from None
        return tasks, finished
