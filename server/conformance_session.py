"""The conformance kit's probe session: its link to the device under test, the
rules it judges by, and the report it writes (:mod:`server.conformance` runs it)."""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import CoveyError, ProtocolError
from device.manifest import load_manifest, manifest_path_for
from device.mqtt import Incoming, MqttLink
from device.protocol import (
    SERVER_ID,
    FrameCodec,
    FrameExtra,
    FrameHeader,
    FrameKind,
    Message,
    Register,
    ServerStatus,
    Topics,
    decode_message,
    encode_frames,
    parse_frame,
)
from device.protocol.typed import from_body
from device.runtime import TFLiteModel

RULES: dict[str, str] = {
    "register": "registers on from/<id>/register with one class count per model class, summing to n_samples",
    "ping": "answers ping with a pong that echoes t",
    "train_parallel": "trains a parallel request and returns a result frame to its group manager",
    "train_shared": "trains from a shared model named in the request",
    "handoff_direct": "hands a chain model straight to its successor, naming the successor's task",
    "train_relay": "returns a relayed chain member's model to the group manager",
    "resend": "sends its last output again on request",
    "pretrain_reply": "answers pretrain with one update frame of trained minus start weights, then a pretrain result",
    "evaluate": "answers evaluate with one row per model (loss, correct <= n)",
    "duplicate_request": "trains a request once even when it arrives twice (it may send the held result again)",
    "held_result": "holds a result until the server's ack and delivers it again, unchanged, to a new coordinator "
    "(a new epoch in server/status)",
    "corrupt_frame": "ignores a frame whose sha256 does not match and trains on the good copy",
    "wrong_predecessor": "ignores a hand-off from a device that is not its predecessor",
    "stale_round": "ignores a model of another round",
    "frames_well_formed": "every frame it sends follows the frame header schema (group an integer, -1 for none)",
    "result_follows_frames": "sends the result message at once after its output frames (within 3 s)",
    "identity": "publishes only under topics that carry its id, and names itself as the sender",
    "codecs": "lists raw, fp16, int8 and int8z in register's codecs when it sends the list, and trains from an "
    "fp16 start model (and from a q8 one if it lists q8)",
    "platform": "says what it is: register carries a platform (machine, OS, backend, cores, RAM) and a train "
    "result its telemetry (peak memory)",
}
PEER, SINK = "conformance-peer", "conformance-sink"


@dataclass
class Verdict:
    rule: str
    passed: bool
    detail: str = ""


@dataclass
class _Seen:
    item: Incoming
    at: float


@dataclass
class Report:
    device: str
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.passed]

    def table(self) -> str:
        lines = [f"conformance of device {self.device!r}:"]
        for v in self.verdicts:
            mark = "pass" if v.passed else "FAIL"
            lines.append(f"  {mark}  {v.rule:<22} {RULES[v.rule]}" + (f"\n        {v.detail}" if v.detail else ""))
        ok = len(self.verdicts) - len(self.failed)
        lines.append(f"{ok} of {len(self.verdicts)} rules hold")
        return "\n".join(lines)


def lenient_frame(frame: bytes) -> tuple[FrameHeader, memoryview, str]:
    """A frame's header and chunk even when the header breaks the schema in ways the
    kit can read past (a ``group`` that is not an integer); the third value says what
    was wrong ("" when nothing was)."""
    try:
        header, chunk = parse_frame(frame)
        return header, chunk, ""
    except ProtocolError as exc:
        problem = str(exc)
    if len(frame) < 8:
        raise ProtocolError(problem)
    (n,) = struct.unpack("<I", frame[4:8])
    raw = json.loads(frame[8 : 8 + n].decode())
    if not isinstance(raw.get("group"), int) or isinstance(raw.get("group"), bool):
        raw["group"] = -1
    return from_body(FrameHeader, raw, "frame header"), memoryview(frame)[8 + n :], problem


class ProbeSession:
    """A conformance run's link to one device: what the kit publishes to it, and
    everything seen on the run's topics since, with the time it arrived.

    The scenarios (:mod:`server.conformance_checks`) drive a device through this
    surface; the kit (:mod:`server.conformance`) adds the run around them."""

    def __init__(
        self,
        host: str,
        port: int,
        run: str,
        device: str,
        model_path: Path,
        *,
        timeout: float = 60.0,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.topics, self.run, self.device, self.timeout = Topics(run), run, device, timeout
        self.model_path = model_path
        self.manifest = load_manifest(manifest_path_for(model_path))
        self.start_weights = TFLiteModel(model_path, self.manifest).get_weights()
        self.link = MqttLink(
            f"covey-{run}-conformance", host, port, username=username, password=password, clean_session=True
        )
        self.seen: list[_Seen] = []
        self.report = Report(device)
        self.frame_problems: list[str] = []
        self.epoch = uuid.uuid4().hex[:8]
        self._tasks = 0
        self.registration: Register | None = None  # the device's register body, once it arrived
        self._model_sha256: str | None = None  # the artifact's, once published

    # -- plumbing --------------------------------------------------------------------------
    def publish(self, topic: str, data: bytes, retain: bool = False) -> None:
        self.link.publish(topic, data, retain=retain)

    def request(self, body: Any, rnd: int = 1) -> None:
        self.publish(
            self.topics.inbox(self.device), Message.of(body, run=self.run, sender=SERVER_ID, round=rnd).encode()
        )

    def new_task(self, what: str) -> str:
        self._tasks += 1
        return f"conf-{self.epoch}-{what}{self._tasks}"

    def send_frames(
        self,
        weights: np.ndarray,
        topic: str,
        *,
        kind: FrameKind = "model",
        sender: str = SERVER_ID,
        rnd: int = 1,
        group: int = 0,
        extra: FrameExtra,
        codec: FrameCodec = "raw",
    ) -> list[bytes]:
        """Publish ``weights`` as frames; with ``codec`` other than raw, ``weights`` is the
        payload that codec encoded (``encode_float``)."""
        frames = list(
            encode_frames(
                weights,
                kind=kind,
                run=self.run,
                round=rnd,
                group=group,
                sender=sender,
                extra=extra,
                codec=codec,
            )
        )
        for f in frames:
            self.publish(topic, f)
        return frames

    def pump(self) -> None:
        item = self.link.receive(0.05)
        if item is not None:
            self.seen.append(_Seen(item, time.monotonic()))

    def wait_for(self, find: Callable[[int], Any], timeout: float | None = None, since: int = 0) -> Any:
        """Pump until ``find(start index)`` returns something, or None at the timeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            found = find(since)
            if found is not None or time.monotonic() > deadline:
                return found
            self.pump()

    def messages(self, since: int, kind: str) -> list[tuple[Message, float]]:
        out = []
        for s in self.seen[since:]:
            if s.item.topic == self.topics.from_device(self.device, kind):  # type: ignore[arg-type]
                try:
                    out.append((decode_message(s.item.payload), s.at))
                except CoveyError:
                    continue
        return out

    def payloads(self, since: int, topic: str) -> list[tuple[FrameHeader, np.ndarray, float]]:
        """Whole payloads reassembled from frames on ``topic`` (leniently)."""
        parts: dict[str, tuple[FrameHeader, dict[int, bytes]]] = {}
        out = []
        for s in self.seen[since:]:
            if s.item.topic != topic:
                continue
            try:
                header, chunk, _ = lenient_frame(s.item.payload)
            except (CoveyError, ValueError, KeyError):
                continue
            head, got = parts.setdefault(header.msg_id, (header, {}))
            got[header.chunk] = bytes(chunk)
            if len(got) == head.n_chunks:
                data = b"".join(got[i] for i in range(head.n_chunks))
                arr = np.frombuffer(data, np.float32) if head.dtype == "float32" else np.frombuffer(data, np.uint8)
                out.append((head, arr, s.at))
        return out

    def epoch_changed(self) -> None:
        """Play a coordinator that restarted: a new epoch in the retained server status."""
        self.epoch = uuid.uuid4().hex[:8]
        status = ServerStatus(self.epoch, "running", model_sha256=self._model_sha256)
        self.publish(self.topics.server_status, Message.of(status, run=self.run, sender=SERVER_ID).encode(), True)

    def verdict(self, rule: str, passed: bool, detail: str = "") -> None:
        self.report.verdicts.append(Verdict(rule, bool(passed), "" if passed else detail))
