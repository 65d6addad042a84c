"""The scenarios the conformance kit runs against a device.

Each scenario sends requests and models as a coordinator would, waits for what the
protocol says must come back (or, for bad input, for a quiet period in which nothing
may come back), and records a verdict on one rule of :data:`server.conformance.RULES`.
"""

from __future__ import annotations

import time

import numpy as np

from device.protocol import (
    SERVER_ID,
    DeviceHop,
    EvaluateRequest,
    EvaluateResult,
    FrameCodec,
    FrameExtra,
    ManagerHop,
    Ping,
    Pong,
    PretrainRequest,
    PretrainResult,
    ResendRequest,
    TrainRequest,
    TrainResult,
    decode,
    encode_float,
    encode_frames,
)
from server.conformance_session import PEER, SINK, ProbeSession
from server.conformance_tools import AT_ONCE_S, QUIET_S, Output, ScenarioTools

REQUIRED_CODECS = ("raw", "fp16", "int8", "int8z")  # what the coordinator sends any version-2 device


class _Checks(ScenarioTools):
    """One method per scenario, each ending in a verdict on its rule."""

    def ping(self) -> None:
        since, t = len(self.kit.seen), time.time()
        self.kit.request(Ping(t), 0)
        pong = self.kit.wait_for(
            lambda i: next((m for m, _ in self.kit.messages(i, "results") if isinstance(m.body, Pong)), None),
            since=since,
        )
        self.kit.verdict(
            "ping",
            pong is not None and pong.body.echo == t,
            "no pong" if pong is None else f"echo {pong.body.echo} for t {t}",
        )

    def parallel(self) -> tuple[TrainRequest, Output | None]:
        since, task = len(self.kit.seen), self.kit.new_task("par")
        request = self.train(task)
        self.send(self.start, task)
        out = self.output(since, self.t.uploads(self.me), task, "result")
        res = self.result(since, task, TrainResult)
        self.note_gap(out, res)
        why = self.trained(out) or ("" if res is not None else "no train result message")
        self.kit.verdict("train_parallel", not why, why)
        return request, out

    def codecs(self) -> None:
        """Every version-2 device decodes ``raw``, ``fp16``, ``int8`` and ``int8z`` (the
        coordinator sends them to any device; only ``int4`` runs ask the ``codecs`` list,
        which agents older than ``int4`` do not send). So a list, when sent, must name
        those four (names this kit does not know are allowed: a newer device may list a
        newer codec), and the device must train from a start model sent as fp16, and,
        if it lists ``q8`` (the whole model in 8-bit blocks, which int8 and int4 runs
        send such a device first), from one sent as q8. The delta codecs need a base the
        device holds, which this kit does not track; covey's own agents are checked on
        them by the equivalence tests."""
        registration = self.kit.registration
        listed = registration.codecs if registration is not None else None
        missing = [c for c in REQUIRED_CODECS if listed is not None and c not in listed]
        if missing:
            self.kit.verdict("codecs", False, f"register lists {sorted(listed or ())}, without {missing}")
            return
        starts: list[FrameCodec] = ["fp16", "q8"] if listed is not None and "q8" in listed else ["fp16"]
        problems = [f"with a {c} start model: {why}" for c in starts if (why := self._trains_from(c))]
        self.kit.verdict("codecs", not problems, "; ".join(problems) or f"trained from {' and '.join(starts)}")

    def _trains_from(self, codec: FrameCodec) -> str:
        """Why the device did not train from a start model sent in ``codec`` ("" if it did)."""
        since, task = len(self.kit.seen), self.kit.new_task("f16" if codec == "fp16" else codec)
        self.train(task)
        extra = FrameExtra(task, index=0, position=0)
        payload = encode_float(self.start, codec)
        self.kit.send_frames(payload, self.t.frames(self.me), sender=SERVER_ID, extra=extra, codec=codec)
        out = self.output(since, self.t.uploads(self.me), task, "result")
        res = self.result(since, task, TrainResult)
        self.note_gap(out, res)
        why = self.trained(out) or ("" if res is not None else "no train result message")
        if not why and out is not None and np.array_equal(out[1], decode(payload, codec)):
            why = f"the output equals the {codec} start model: nothing was trained"
        return why

    def duplicate(self, request: TrainRequest, first: Output | None) -> None:
        """The same request again: the device must not train again. It may deliver the
        result it holds once more (a resumed coordinator relies on that): the same
        model and the same result message (same message id), never a new one."""
        ids = {m.id for m, _ in self.kit.messages(0, "results") if getattr(m.body, "task_id", None) == request.task_id}
        since = len(self.kit.seen)
        self.kit.request(request, 1)
        self.send(self.start, request.task_id)
        again = self.output(since, self.t.uploads(self.me), request.task_id, "result", timeout=QUIET_S)
        new_results = [
            m
            for m, _ in self.kit.messages(since, "results")
            if getattr(m.body, "task_id", None) == request.task_id and m.id not in ids
        ]
        same = again is None or (first is not None and np.array_equal(again[1], first[1]))
        self.kit.verdict("duplicate_request", same and not new_results, "trained the same task twice")

    def held(self, request: TrainRequest, first: Output | None) -> None:
        """A coordinator restarted (``--resume``): a new epoch in ``server/status``. The
        device registers again and delivers every result not yet acknowledged (the kit
        never acks), unchanged: the same output and the same result message."""
        ids = {m.id for m, _ in self.kit.messages(0, "results") if getattr(m.body, "task_id", None) == request.task_id}
        since = len(self.kit.seen)
        self.kit.epoch_changed()
        again = self.output(since, self.t.uploads(self.me), request.task_id, "result")
        redelivered = [
            m for m, _ in self.kit.messages(since, "results") if getattr(m.body, "task_id", None) == request.task_id
        ]
        why = ""
        if first is None:
            why = "no first output to compare with"
        elif again is None:
            why = "nothing delivered again after the new epoch: a restarted coordinator would wait out a deadline"
        elif not np.array_equal(again[1], first[1]):
            why = "the output delivered again differs from the first (trained again?)"
        elif not any(m.id in ids for m in redelivered):
            why = "the result message was not delivered again unchanged (same message id)"
        self.kit.verdict("held_result", not why, why)

    def shared(self) -> None:
        since, task, key = len(self.kit.seen), self.kit.new_task("shr"), f"conf-{self.kit.epoch}-shared"
        for i, frame in enumerate(
            encode_frames(
                self.start,
                kind="model",
                run=self.kit.run,
                round=1,
                group=0,
                sender=SERVER_ID,
                extra=FrameExtra(shared=key),
            )
        ):
            self.kit.publish(self.t.shared_chunk(key, i), frame, retain=True)
        self.train(task, shared=(key,))
        out = self.output(since, self.t.uploads(self.me), task, "result")
        res = self.result(since, task, TrainResult)
        self.note_gap(out, res)
        for i in range(64):
            self.kit.publish(self.t.shared_chunk(key, i), b"", retain=True)
        self.kit.verdict("train_shared", not self.trained(out), self.trained(out))

    def handoff(self) -> tuple[str, Output | None]:
        since, task = len(self.kit.seen), self.kit.new_task("chn")
        self.train(task, group=1, position=1, mode="chain", predecessor=PEER, next=DeviceHop(SINK, "sink-task"))
        self.handled()
        self.send(self.start, task, sender=PEER)
        out = self.output(since, self.t.handoff(SINK, self.me), "sink-task", "handoff")
        res = self.result(since, task, TrainResult)
        self.note_gap(out, res)
        why = self.trained(out)
        if out is None:
            why = "nothing arrived on the successor's topic device/<successor>/frames/from/<id> with its task id"
        self.kit.verdict("handoff_direct", not why, why)
        return task, out

    def resend(self, task: str, before: Output | None) -> None:
        since = len(self.kit.seen)
        self.kit.request(ResendRequest(task, ManagerHop(1)), 1)
        out = self.output(since, self.t.uploads(self.me), task, "result")
        same = out is not None and before is not None and np.array_equal(out[1], before[1])
        self.kit.verdict("resend", same, "no resent output" if out is None else "the resent model differs")

    def relay(self) -> None:
        since, task = len(self.kit.seen), self.kit.new_task("rly")
        self.train(task, group=2, position=1, mode="chain", next=ManagerHop(2))
        self.send(self.start, task)
        out = self.output(since, self.t.uploads(self.me), task, "result")
        res = self.result(since, task, TrainResult)
        self.note_gap(out, res)
        self.kit.verdict("train_relay", not self.trained(out), self.trained(out))

    def pretrain(self) -> None:
        since, task = len(self.kit.seen), self.kit.new_task("pre")
        self.kit.request(PretrainRequest(task, 5, 5, 0.01, 1), 1)
        self.send(self.start, task)
        out = self.output(since, self.t.uploads(self.me), task, "update")
        res = self.result(since, task, PretrainResult)
        why = ""
        if out is None:
            why = "no update frame on from/<id>/frames"
        elif out[1].shape != (self.n_params,) or not np.isfinite(out[1]).all() or not out[1].any():
            why = "the update is not a finite, non-zero vector of the model's length"
        elif np.linalg.norm(out[1]) > 0.5 * np.linalg.norm(self.start):
            why = "the update holds the trained weights, not trained minus start"
        elif res is None:
            why = "no pretrain result message after the update frame"
        self.kit.verdict("pretrain_reply", not why, why)

    def evaluate(self) -> None:
        since, task = len(self.kit.seen), self.kit.new_task("evl")
        self.kit.request(EvaluateRequest(task, 2, "test"), 1)
        self.send(self.start, task, index=0)
        self.send(self.start * 0.5, task, index=1)
        res = self.result(since, task, EvaluateResult)
        rows = res[0].evaluations if res is not None else ()
        ok = sorted(r.index for r in rows) == [0, 1] and all(r.correct <= r.n for r in rows)
        self.kit.verdict("evaluate", ok, "no evaluate result" if res is None else f"rows {rows}")

    def corrupt(self) -> None:
        since, task = len(self.kit.seen), self.kit.new_task("bad")
        self.train(task)
        (frame,) = encode_frames(
            self.start,
            kind="model",
            run=self.kit.run,
            round=1,
            group=0,
            sender=SERVER_ID,
            extra=FrameExtra(task, position=0),
            max_chunk=10**9,
        )
        self.kit.publish(self.t.frames(self.me), frame[:-4] + bytes(b ^ 0xFF for b in frame[-4:]))  # bits flipped
        ignored = self.quiet(since, self.t.uploads(self.me), task, "result")
        self.send(self.start, task)
        later = self.output(since, self.t.uploads(self.me), task, "result")
        self.kit.verdict(
            "corrupt_frame",
            ignored and later is not None,
            "trained on a corrupted frame" if not ignored else "did not train on the good copy",
        )

    def wrong_predecessor(self) -> None:
        since, task = len(self.kit.seen), self.kit.new_task("prd")
        self.train(task, position=1, mode="chain", predecessor=PEER, next=DeviceHop(SINK, "sink-2"))
        self.handled()
        self.send(self.start, task, sender="conformance-intruder")
        ignored = self.quiet(since, self.t.handoff(SINK, self.me), "sink-2", "handoff")
        self.send(self.start, task, sender=PEER)
        later = self.output(since, self.t.handoff(SINK, self.me), "sink-2", "handoff")
        self.kit.verdict(
            "wrong_predecessor",
            ignored and later is not None,
            "trained on a stranger's hand-off" if not ignored else "ignored its real predecessor",
        )

    def stale(self) -> None:
        since, task = len(self.kit.seen), self.kit.new_task("old")
        self.train(task)
        self.send(self.start, task, rnd=7)
        ignored = self.quiet(since, self.t.uploads(self.me), task, "result")
        self.send(self.start, task)
        later = self.output(since, self.t.uploads(self.me), task, "result")
        self.kit.verdict(
            "stale_round",
            ignored and later is not None,
            "trained on a model of round 7 for a round-1 task" if not ignored else "missed the real model",
        )


def check_platform(kit: ProbeSession, train_results: list[TrainResult]) -> None:
    """The board says what it is (docs/protocol.md, "What a board says about itself")."""
    registration = kit.registration
    problems = []
    if registration is None or registration.platform is None:
        problems.append("register carries no platform: the server cannot tell what this board is")
    if not train_results:
        problems.append("no train result arrived to carry telemetry")
    elif all(r.telemetry is None for r in train_results):
        problems.append(f"none of its {len(train_results)} train results carries telemetry")
    p = registration.platform if registration is not None else None
    detail = "; ".join(problems) or (f"{p.machine}, {p.os}, {p.backend} {p.backend_version}" if p else "")
    kit.verdict("platform", not problems, detail)


def run_checks(kit: ProbeSession) -> None:
    c = _Checks(kit)
    c.ping()
    request, first = c.parallel()
    c.duplicate(request, first)
    c.held(request, first)
    c.codecs()
    c.shared()
    task, out = c.handoff()
    c.resend(task, out)
    c.relay()
    c.pretrain()
    c.evaluate()
    c.corrupt()
    c.wrong_predecessor()
    c.stale()
    check_platform(kit, c.train_results)
    late = [g for g in c.gaps if g > AT_ONCE_S]
    kit.verdict(
        "result_follows_frames",
        not late and bool(c.gaps),
        f"result messages came {', '.join(f'{g:.1f} s' for g in late)} after the output frames",
    )
