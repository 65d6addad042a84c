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

from pathlib import Path

from device.errors import CoveyError, TransportError
from device.protocol import (
    DEFAULT_MAX_CHUNK,
    SERVER_ID,
    Message,
    Register,
    ServerStatus,
    Stop,
    decode_message,
    parse_frame,
)
from server.conformance_checks import run_checks
from server.conformance_session import RULES, ProbeSession, Report
from server.presence import Presence

__all__ = ["RULES", "ConformanceKit", "Report", "run_conformance"]


class ConformanceKit(ProbeSession):
    """The server side of a conformance run against one device: set-up, every
    scenario of :mod:`server.conformance_checks`, then the checks over all it saw."""

    # -- the run ------------------------------------------------------------------------------
    def setup(self) -> Register | None:
        self.link.connect(15)
        self.link.subscribe(self.topics.everything)
        presence = Presence.of_model(self.model_path, self.manifest, self.topics, self.epoch, DEFAULT_MAX_CHUNK)
        presence.publish(self.publish, lambda topic, data: self.publish(topic, data, retain=True))
        self._model_sha256 = presence.model_sha256
        found = self.wait_for(
            lambda since: next((m for m, _ in self.messages(0, "register") if isinstance(m.body, Register)), None),
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
                self.request(Stop("the conformance run is over"), 0)
                self.publish(
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
