"""What a server keeps retained on the broker for every device of a run: the model
artifact (its chunks and manifest: a board needs no model files) and the server's
status (its epoch, running or stopped, and the artifact's sha256). The coordinator
and the conformance kit publish the same (``device/agent.py`` reads them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from device.manifest import Manifest
from device.protocol import DEFAULT_MAX_CHUNK, SERVER_ID, Message, Publish, ServerStatus, Topics, send_model
from server.artifact import artifact_for_devices


@dataclass(frozen=True)
class Presence:
    """One server process's retained messages.

    Parameters
    ----------
    topics : the run's topics.
    epoch : this process (a new epoch tells devices to register again).
    artifact, manifest : the model as devices download it and its manifest
        (:func:`~server.artifact.artifact_for_devices`: without initial values, since
        every request brings the weights to start from).
    max_chunk : payload bytes per artifact chunk.
    """

    topics: Topics
    epoch: str
    artifact: bytes
    manifest: dict[str, Any]
    max_chunk: int = DEFAULT_MAX_CHUNK

    @classmethod
    def of_model(cls, model_path: Path, manifest: Manifest, topics: Topics, epoch: str, max_chunk: int) -> Presence:
        artifact, artifact_manifest = artifact_for_devices(model_path, manifest.to_dict())
        return cls(topics, epoch, artifact, artifact_manifest, max_chunk)

    @property
    def model_sha256(self) -> str:
        """The sha256 of what devices download, not of the server's own model file."""
        return str(self.manifest["sha256"])

    def status(self, state: Literal["running", "stopped"]) -> bytes:
        body = ServerStatus(self.epoch, state, model_sha256=self.model_sha256)
        return Message.of(body, run=self.topics.run, sender=SERVER_ID).encode()

    def publish(self, chunk: Publish, confirmed: Callable[[str, bytes], None]) -> None:
        """The artifact's chunks (through ``chunk``), then its manifest and the running
        status (through ``confirmed``: retained, and waited for where the link can);
        a device that sees the manifest finds every chunk retained already."""
        send_model(
            chunk,
            self.topics.artifact_chunk,
            np.frombuffer(self.artifact, np.uint8),
            kind="artifact",
            run=self.topics.run,
            round=0,
            group=-1,
            sender=SERVER_ID,
            max_chunk=self.max_chunk,
            retain=True,
        )
        confirmed(self.topics.artifact_manifest, json.dumps(self.manifest).encode())
        confirmed(self.topics.server_status, self.status("running"))
