"""A conformance kit: drive any device through the protocol and say what conforms.

``covey conformance --broker HOST:PORT --run RUN --device ID`` plays the server of
run ``RUN``: it publishes the model artifact and a running status, waits for the
device to register, then sends it every kind of request — parallel and chain
training, direct and relayed hand-offs, a shared start model, pre-training,
evaluation, ``resend``, ``ping``, a start model sent as fp16 — and checks the codecs
it registers, and sends bad input it must ignore (a duplicate
request, a corrupted frame, a hand-off from a device that is not its predecessor,
a model of another round). It watches everything on ``covey/RUN/#`` and judges the
device by the rules of ``docs/protocol.md`` (:data:`RULES`), each reported as
passed or failed with what was seen. Works with covey's agent and any third-party
device; nothing here is covey-agent specific.
"""

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

from device.errors import CoveyError, ProtocolError, TransportError
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
    Stop,
    Topics,
    decode_message,
    encode_frames,
    parse_frame,
)
from device.protocol.typed import from_body
from device.runtime import TFLiteModel
from server.artifact import artifact_for_devices

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


class ConformanceKit:
    """The server side of a conformance run against one device."""

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
    def _publish(self, topic: str, data: bytes, retain: bool = False) -> None:
        self.link.publish(topic, data, retain=retain)

    def _request(self, body: Any, rnd: int = 1) -> None:
        self._publish(
            self.topics.inbox(self.device), Message.of(body, run=self.run, sender=SERVER_ID, round=rnd).encode()
        )

    def _task(self, what: str) -> str:
        self._tasks += 1
        return f"conf-{self.epoch}-{what}{self._tasks}"

    def _frames(
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
            self._publish(topic, f)
        return frames

    def _pump(self) -> None:
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
            self._pump()

    def _messages(self, since: int, kind: str) -> list[tuple[Message, float]]:
        out = []
        for s in self.seen[since:]:
            if s.item.topic == self.topics.from_device(self.device, kind):  # type: ignore[arg-type]
                try:
                    out.append((decode_message(s.item.payload), s.at))
                except CoveyError:
                    continue
        return out

    def _payloads(self, since: int, topic: str) -> list[tuple[FrameHeader, np.ndarray, float]]:
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
        self._publish(self.topics.server_status, Message.of(status, run=self.run, sender=SERVER_ID).encode(), True)

    def verdict(self, rule: str, passed: bool, detail: str = "") -> None:
        self.report.verdicts.append(Verdict(rule, bool(passed), "" if passed else detail))

    # -- the run ------------------------------------------------------------------------------
    def setup(self) -> Register | None:
        self.link.connect(15)
        self.link.subscribe(self.topics.everything)
        model_bytes, manifest = artifact_for_devices(self.model_path, self.manifest.to_dict())
        for i, frame in enumerate(
            encode_frames(
                np.frombuffer(model_bytes, np.uint8), kind="artifact", run=self.run, round=0, group=-1, sender=SERVER_ID
            )
        ):
            self._publish(self.topics.artifact_chunk(i), frame, retain=True)
        self._publish(self.topics.artifact_manifest, json.dumps(manifest).encode(), retain=True)
        self._model_sha256 = manifest["sha256"]
        status = ServerStatus(self.epoch, "running", model_sha256=manifest["sha256"])
        self._publish(self.topics.server_status, Message.of(status, run=self.run, sender=SERVER_ID).encode(), True)
        found = self.wait_for(
            lambda since: next((m for m, _ in self._messages(0, "register") if isinstance(m.body, Register)), None),
            self.timeout * 3,
        )
        return found.body if found is not None else None

    def run_all(self) -> Report:
        try:
            body = self.registration = self.setup()
            counts_ok = body is not None and len(body.class_counts) == self.manifest.n_classes
            self.verdict(
                "register",
                counts_ok,
                "no valid registration arrived"
                if body is None
                else f"{len(body.class_counts)} class counts for a {self.manifest.n_classes}-class model",
            )
            if body is None:
                return self.report
            from server.conformance_checks import run_checks

            run_checks(self)
            self._check_frames_and_identity()
        finally:
            self._finish()
        return self.report

    def _check_frames_and_identity(self) -> None:
        problems, strangers = [], []
        for s in self.seen:
            topic = s.item.topic
            mine = self.topics.device_of(topic)
            handoff = f"/frames/from/{self.device}" in topic
            if (mine is not None and mine[0] == self.device) or handoff:
                if (mine is not None and mine[1] == "frames") or handoff:
                    try:
                        header, _ = parse_frame(s.item.payload)
                        if header.sender != self.device:
                            strangers.append(f"frame naming {header.sender!r} on {topic}")
                    except CoveyError as exc:
                        problems.append(f"{topic}: {exc}")
                elif mine is not None and mine[1] in ("register", "results"):
                    try:
                        msg = decode_message(s.item.payload)
                        if msg.sender != self.device:
                            strangers.append(f"message naming {msg.sender!r} on {topic}")
                    except CoveyError as exc:
                        problems.append(f"{topic}: {exc}")
        self.verdict("frames_well_formed", not problems, "; ".join(sorted(set(problems))[:3]))
        self.verdict("identity", not strangers, "; ".join(strangers[:3]))

    def _finish(self) -> None:
        try:
            if self.link.connected:
                self._request(Stop("the conformance run is over"), 0)
                self._publish(
                    self.topics.server_status,
                    Message.of(ServerStatus(self.epoch, "stopped"), run=self.run, sender=SERVER_ID).encode(),
                    True,
                )
                for i in range(64):  # clear what the kit left retained
                    self.link.publish(self.topics.artifact_chunk(i), b"", retain=True)
                self.link.publish(self.topics.artifact_manifest, b"", retain=True, wait=10)
        except TransportError:
            pass
        self.link.close()


def run_conformance(
    host: str,
    port: int,
    run: str,
    device: str,
    model_path: Path,
    *,
    timeout: float = 60.0,
    username: str | None = None,
    password: str | None = None,
) -> Report:
    return ConformanceKit(
        host, port, run, device, model_path, timeout=timeout, username=username, password=password
    ).run_all()
