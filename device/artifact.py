"""The model a device downloads: the retained manifest and ``artifact`` frames.

The server publishes the ``.tflite`` file (without initial values) in retained
``artifact`` frames and its manifest, retained, beside them. The device collects
both, checks the file's sha256 against the manifest and only then writes and loads
it. A garbage manifest or a frame of the wrong kind is refused with the reason; the
download simply waits for a good copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device.errors import ModelError, ProtocolError
from device.manifest import Manifest, parse_manifest, sha256_hex
from device.protocol import parse_frame


@dataclass
class ArtifactDownload:
    """Manifest and chunks as they arrive; :meth:`complete` once the sha256 matches."""

    manifest_raw: dict[str, Any] | None = None
    manifest: Manifest | None = None
    chunks: dict[int, memoryview] = field(default_factory=dict)
    total: int | None = None
    sha256: str | None = None  # of the chunks' payload, from their header

    def add_manifest(self, payload: bytes) -> None:
        try:
            raw = json.loads(payload.decode())
        except (ValueError, RecursionError):  # not UTF-8, not JSON, a > 4300-digit integer, too deep
            raise ProtocolError("the artifact manifest is not UTF-8 JSON") from None
        manifest = parse_manifest(raw, "artifact manifest")  # ModelError names the bad field
        self.manifest_raw, self.manifest = raw, manifest

    def add_chunk(self, payload: bytes) -> None:
        header, chunk = parse_frame(payload)
        if header.kind != "artifact" or header.dtype != "uint8":
            raise ProtocolError(f"the artifact topic carried a {header.kind} frame of {header.dtype}")
        if self.sha256 != header.sha256:  # a new upload: start over
            self.chunks, self.sha256 = {}, header.sha256
        self.chunks[header.chunk] = chunk
        self.total = header.n_chunks

    def complete(self) -> tuple[bytes, Manifest, dict[str, Any]] | None:
        """The file, its manifest and the raw manifest once everything arrived and matches."""
        if self.manifest is None or self.manifest_raw is None or self.total is None or len(self.chunks) < self.total:
            return None
        data = b"".join(self.chunks[i] for i in range(self.total))
        if sha256_hex(data) != self.manifest.sha256:
            self.chunks.clear()
            raise ModelError("downloaded model does not match its manifest's sha256; waiting for a fresh copy")
        return data, self.manifest, self.manifest_raw

    def save(self, directory: Path, data: bytes, manifest: Manifest, raw: dict[str, Any]) -> Path:
        from device.state import atomic_write

        path = directory / f"{manifest.model}.tflite"
        atomic_write(path, data)
        atomic_write(path.with_suffix(".json"), json.dumps(raw).encode())
        self.chunks.clear()
        return path
