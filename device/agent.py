"""The device agent: register, fetch the model, train, hand on, report.

One loop, one thread of our own (paho's network thread only enqueues). Work arrives
as JSON requests on ``device/<id>/inbox``; models arrive as frames on
``device/<id>/frames``. Every receive is validated before it acts; what is refused
is logged with the reason and counted (``AgentStats``), and the loop goes on.

A request may name *shared* models instead (``"shared": [key, ...]``): models the
server published once, retained, for many devices. The device subscribes to them on
the request, takes the retained frames the broker delivers, and unsubscribes as soon
as no waiting task needs them.

A train request names the device's place in its group (round, group, position), the
sender it must accept a model from (its predecessor, or the server/manager), and
where its result goes: the successor's frames topic (direct hand-off) or the group
manager (relay, and always for the last device of a chain or a parallel member).
QoS 1 may redeliver a request: requests are deduplicated by task id, so a device
trains at most once per task. The device keeps its id, its last finished task and
its last output model on disk, so a restarted agent resumes and can still answer a
``resend`` for work it finished before the restart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device.data import Dataset, class_counts
from device.errors import CoveyError, DataError, ModelError, ProtocolError, TransportError
from device.manifest import parse_manifest, sha256_hex
from device.mqtt import Incoming, MqttLink, TlsFiles, Will
from device.protocol import (
    SERVER_ID,
    Message,
    Reassembler,
    Topics,
    check_id,
    check_weights,
    decode_message,
    encode_frames,
)
from device.runtime import TFLiteModel
from device.worker import ModelWorker

log = logging.getLogger("covey.device")


@dataclass
class AgentConfig:
    device_id: str
    run: str
    host: str
    port: int
    state_dir: Path
    username: str | None = None
    password: str | None = None
    tls: TlsFiles | None = None
    max_chunk: int = 900_000
    threads: int | None = None
    request_timeout: float = 120.0
    train_priority: str = "idle"  # "idle": interpreter work yields to everything else (device/worker.py)


@dataclass
class AgentStats:
    trained: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


@dataclass
class _Task:
    body: dict[str, Any]
    round: int
    started: float = field(default_factory=time.monotonic)


class Agent:
    """A device: local data, a LiteRT model fetched over MQTT, and the request loop."""

    def __init__(self, config: AgentConfig, train: Dataset, test: Dataset | None = None) -> None:
        check_id(config.device_id)
        self.cfg = config
        self.topics = Topics(config.run)
        self.train_data, self.test_data = train, test
        self.stats = AgentStats()
        self.model: TFLiteModel | None = None
        self.manifest_raw: dict[str, Any] | None = None
        self._chunks: dict[int, memoryview] = {}
        self._frames = Reassembler()
        self._waiting: dict[str, _Task] = {}  # task id -> train/pretrain/evaluate waiting for model frames
        self._eval_models: dict[str, dict[int, np.ndarray]] = {}
        self._done_tasks: set[str] = set()
        self._shared_subscribed: set[str] = set()
        self._last_output: np.ndarray | None = None
        self._last_output_task: dict[str, Any] | None = None
        self.running = True
        self.worker = ModelWorker(config.train_priority, name=f"covey-model-{config.device_id}")
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self._load_state()
        self.link = MqttLink(
            f"covey-{config.run}-{config.device_id}",
            config.host,
            config.port,
            username=config.username,
            password=config.password,
            tls=config.tls,
            will=Will(self.topics.status(config.device_id), b"offline"),
            clean_session=False,
        )

    # -- persistent state ----------------------------------------------------------------
    @property
    def _state_file(self) -> Path:
        return self.cfg.state_dir / "state.json"

    def _load_state(self) -> None:
        if self._state_file.exists():
            try:
                state = json.loads(self._state_file.read_text())
                self._done_tasks = set(state.get("done_tasks", []))
                out = self.cfg.state_dir / "last_output.npy"
                if out.exists():
                    self._last_output = np.load(out, allow_pickle=False)
                    self._last_output_task = state.get("last_output_task")
                log.info("%s: resumed (%d finished tasks on record)", self.cfg.device_id, len(self._done_tasks))
            except (OSError, ValueError) as exc:
                log.warning("%s: ignoring unreadable state file (%s)", self.cfg.device_id, exc)

    def _save_state(self) -> None:
        state = {
            "device_id": self.cfg.device_id,
            "run": self.cfg.run,
            "done_tasks": sorted(self._done_tasks)[-500:],
            "last_output_task": self._last_output_task,
        }
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._state_file)
        if self._last_output is not None:
            np.save(self.cfg.state_dir / "last_output.npy", self._last_output, allow_pickle=False)

    # -- connection ------------------------------------------------------------------------
    def start(self, connect_timeout: float = 15.0) -> None:
        self.link.connect(connect_timeout)
        me = self.cfg.device_id
        self.link.subscribe(
            self.topics.inbox(me),
            self.topics.frames(me),
            self.topics.artifact_manifest,
            f"{self.topics.root}/artifact/chunk/#",
        )
        self.link.publish(self.topics.status(me), b"online", retain=True)
        self._register()

    def _register(self) -> None:
        n_classes = int(self.manifest_raw["n_classes"]) if self.manifest_raw else int(self.train_data.y.max()) + 1
        body = {
            "n_samples": len(self.train_data),
            "n_test": len(self.test_data) if self.test_data else 0,
            "class_counts": class_counts(self.train_data.y, max(n_classes, 1)).tolist(),
            "runtime": self.model.backend.name if self.model else "pending",
            "memory_mb": _available_memory_mb(),
            "direct": True,
        }
        self._send(Message("register", self.cfg.run, self.cfg.device_id, 0, body), self.topics.register)

    def _send(self, msg: Message, topic: str | None = None) -> None:
        self.link.publish(topic or self.topics.results, msg.encode())

    # -- the loop ----------------------------------------------------------------------------
    def run_forever(self, idle_timeout: float | None = None) -> None:
        """Serve requests until a ``stop`` request (or ``idle_timeout`` seconds of silence)."""
        last = time.monotonic()
        while self.running:
            item = self.link.receive(timeout=1.0)
            if item is None:
                if idle_timeout is not None and time.monotonic() - last > idle_timeout:
                    log.info("%s: idle for %.0f s, leaving", self.cfg.device_id, idle_timeout)
                    break
                continue
            last = time.monotonic()
            try:
                self.handle(item)
            except (CoveyError, OSError) as exc:
                log.warning("%s: dropped a message on %s: %s", self.cfg.device_id, item.topic, exc)
                self.stats.drop(type(exc).__name__)

    def handle(self, item: Incoming) -> None:
        me = self.cfg.device_id
        if item.topic == self.topics.artifact_manifest or item.topic.startswith(f"{self.topics.root}/artifact/chunk/"):
            self._on_artifact(item)
        elif item.topic == self.topics.inbox(me):
            self._on_request(decode_message(item.payload))
        elif item.topic == self.topics.frames(me):
            payload = self._frames.add(item.payload)
            if payload is not None:
                self._on_model(payload)
        elif item.topic.startswith(self.topics.shared_root):
            if not item.payload:
                return  # the server cleared a shared model it no longer needs
            payload = self._frames.add(item.payload)
            if payload is not None:
                self._on_model(payload)
        else:
            self.stats.drop("unexpected topic")

    # -- artifact ----------------------------------------------------------------------------
    def _on_artifact(self, item: Incoming) -> None:
        if item.topic == self.topics.artifact_manifest:
            raw = json.loads(item.payload.decode())
            parse_manifest(raw, "artifact manifest")
            self.manifest_raw = raw
        else:
            from device.protocol import parse_frame

            header, chunk = parse_frame(item.payload)
            if header.kind != "artifact":
                raise ProtocolError("artifact topic carried a non-artifact frame")
            self._chunks[header.chunk] = chunk
            self._artifact_total = header.n_chunks
        self._try_load_model()

    def _try_load_model(self) -> None:
        if (
            self.model is not None
            or self.manifest_raw is None
            or len(self._chunks) < getattr(self, "_artifact_total", 1)
        ):
            return
        data = b"".join(self._chunks[i] for i in range(self._artifact_total))
        manifest = parse_manifest(self.manifest_raw, "artifact manifest")
        if sha256_hex(data) != manifest.sha256:
            self._chunks.clear()
            raise ModelError("downloaded model does not match its manifest's sha256; waiting for a fresh copy")
        path = self.cfg.state_dir / f"{manifest.model}.tflite"
        path.write_bytes(data)
        path.with_suffix(".json").write_text(json.dumps(self.manifest_raw))
        # created in the worker thread, so interpreter helper threads inherit its priority
        model = self._in_worker(TFLiteModel, path, manifest, num_threads=self.cfg.threads)
        model.check_data(self.train_data.x, self.train_data.y)
        self.model = model
        self._chunks.clear()
        log.info("%s: model %s ready (%s)", self.cfg.device_id, manifest.model, self.model.backend.name)
        self._register()  # now with the model's class count and runtime

    # -- requests -------------------------------------------------------------------------
    def _on_request(self, msg: Message) -> None:
        if msg.run != self.cfg.run:
            raise ProtocolError(f"request for run {msg.run!r}, this device serves {self.cfg.run!r}")
        if msg.sender != SERVER_ID:
            raise ProtocolError(f"request from {msg.sender!r}; only the server sends requests")
        if msg.type == "ping":
            self._send(Message("pong", self.cfg.run, self.cfg.device_id, msg.round, {"echo": msg.body.get("t")}))
        elif msg.type == "stop":
            self.running = False
        elif msg.type == "resend":
            self._resend(msg)
        elif msg.type in ("train", "pretrain", "evaluate"):
            task_id = str(msg.body.get("task_id", ""))
            if not task_id:
                raise ProtocolError("request has no task_id")
            if task_id in self._done_tasks or task_id in self._waiting:
                self.stats.drop("duplicate request")
                return
            shared = msg.body.get("shared", [])
            if not isinstance(shared, list) or len(shared) > 64 or not all(isinstance(k, str) for k in shared):
                raise ProtocolError("request field 'shared' must be a list of model keys")
            for key in shared:
                check_id(key, "model key")
            self._waiting[task_id] = _Task({**msg.body, "type": msg.type}, msg.round)
            log.info(
                "%s: round %d %s request %s; waiting for its model", self.cfg.device_id, msg.round, msg.type, task_id
            )
            new = [k for k in shared if k not in self._shared_subscribed]
            if new:
                self._shared_subscribed.update(new)
                self.link.subscribe(*(self.topics.shared_filter(k) for k in new))
        elif msg.type == "assignment":
            pass
        else:
            raise ProtocolError(f"devices do not handle {msg.type!r} requests")

    def _on_model(self, payload: Any) -> None:
        header = payload.header
        key = header.extra.get("shared")
        if key is not None:
            targets = [
                (task_id, task, list(task.body["shared"]).index(key))
                for task_id, task in list(self._waiting.items())
                if key in task.body.get("shared", ())
            ]
            if not targets:
                self.stats.drop("shared model for no waiting task")
                log.debug("%s: shared model %r for no waiting task", self.cfg.device_id, key)
        else:
            task_id = str(header.extra.get("task_id", ""))
            task = self._waiting.get(task_id)
            if task is None:
                self.stats.drop("frame for no waiting task")
                raise ProtocolError(f"model frame for task {task_id!r}, which this device is not waiting for")
            targets = [(task_id, task, int(header.extra.get("index", 0)))]
        try:
            for task_id, task, index in targets:
                self._accept_model(task_id, task, payload, index)
        finally:
            self._drop_unused_shared()

    def _accept_model(self, task_id: str, task: _Task, payload: Any, index: int) -> None:
        header = payload.header
        if header.round != task.round:
            self.stats.drop("stale round")
            raise ProtocolError(f"model frame for round {header.round}, task is in round {task.round}")
        allowed = {SERVER_ID, str(task.body.get("predecessor") or SERVER_ID)}
        if header.sender not in allowed:
            self.stats.drop("not the predecessor")
            raise ProtocolError(f"hand-off from {header.sender!r}, expected one of {sorted(allowed)}")
        if self.model is None:
            raise ModelError("no model artifact yet; cannot train")
        weights = check_weights(payload, self.model.n_params)
        kind = task.body["type"]
        if kind == "evaluate":
            got = self._eval_models.setdefault(task_id, {})
            got[index] = weights
            if len(got) >= int(task.body.get("n_models", 1)):
                self._evaluate(task_id, task, got)
            return
        del self._waiting[task_id]
        log.info("%s: model for %s arrived from %s; %sing", self.cfg.device_id, task_id, header.sender, kind)
        if kind == "pretrain":
            self._pretrain(task_id, task, weights)
        else:
            self._train(task_id, task, weights)

    def _drop_unused_shared(self) -> None:
        """Unsubscribe from shared models no waiting task needs any more."""
        needed = {k for task in self._waiting.values() for k in task.body.get("shared", ())}
        unused = self._shared_subscribed - needed
        if unused:
            self._shared_subscribed -= unused
            self.link.unsubscribe(*(self.topics.shared_filter(k) for k in unused))

    # -- work ---------------------------------------------------------------------------
    def _task_seed(self, task: _Task) -> list[int]:
        return [int(task.body.get("seed", 0)), task.round, int.from_bytes(self.cfg.device_id.encode()[-8:], "little")]

    def _train(self, task_id: str, task: _Task, weights: np.ndarray) -> None:
        assert self.model is not None
        b = task.body
        start = time.perf_counter()
        result = self._in_worker(
            self.model.train,
            self.train_data.x,
            self.train_data.y,
            epochs=int(b.get("epochs", 1)),
            batch_size=int(b.get("batch", 10)),
            lr=float(b.get("lr", 0.01)),
            mu=float(b.get("mu", 0.0)),
            max_steps=int(b["max_steps"]) if b.get("max_steps") else None,
            seed=np.random.default_rng(self._task_seed(task)),
            initial_weights=weights,
        )
        seconds = time.perf_counter() - start
        self.stats.trained += 1
        self._last_output, self._last_output_task = result.weights, {"task_id": task_id, **b, "round": task.round}
        self._done_tasks.add(task_id)
        delivered = time.perf_counter()
        self._deliver(result.weights, b, task.round, task_id)  # first: the chain waits on it
        deliver_seconds = time.perf_counter() - delivered
        counts = class_counts(self.train_data.y, self.model.manifest.n_classes).tolist()
        self._send(
            Message(
                "result",
                self.cfg.run,
                self.cfg.device_id,
                task.round,
                {
                    "task_id": task_id,
                    "n_samples": result.n_samples,
                    "loss": result.mean_loss,
                    "train_seconds": seconds,
                    "deliver_seconds": deliver_seconds,
                    "group": b.get("group"),
                    "position": b.get("position"),
                    "class_counts": counts,
                },
            )
        )
        self._save_state()  # for a resend after a restart; off the round's critical path
        log.info(
            "%s: round %d group %s position %s trained %d samples, loss %.3f (%.1f s)",
            self.cfg.device_id,
            task.round,
            b.get("group"),
            b.get("position"),
            result.n_samples,
            result.mean_loss,
            seconds,
        )

    def _deliver(
        self, weights: np.ndarray, body: dict[str, Any], rnd: int, task_id: str, to: dict[str, Any] | None = None
    ) -> None:
        """Send a trained model on: to the successor (direct) or the group manager."""
        dest = to or body.get("next") or {}
        group = int(body.get("group", 0))
        if "device" in dest:
            topic = self.topics.frames(str(dest["device"]))
            kind, extra = "handoff", {"task_id": str(dest.get("task_id", "")), "position": body.get("position")}
        else:
            topic = self.topics.group_frames(group)
            kind, extra = "result", {"task_id": task_id, "position": body.get("position")}
        for frame in encode_frames(
            weights,
            kind=kind,
            run=self.cfg.run,
            round=rnd,
            group=group,
            sender=self.cfg.device_id,
            max_chunk=self.cfg.max_chunk,
            extra=extra,
        ):
            self.link.publish(topic, frame)

    def _resend(self, msg: Message) -> None:
        """The manager lost a hand-off (a successor missed its deadline): send the last
        output again, to the destination the request names."""
        wanted = str(msg.body.get("task_id", ""))
        if self._last_output is None or not self._last_output_task or self._last_output_task.get("task_id") != wanted:
            raise ProtocolError(f"resend of task {wanted!r}, but the last output on record is for another task")
        body = dict(self._last_output_task)
        self._deliver(
            self._last_output, body, int(body["round"]), wanted, to=msg.body.get("to") or {"group": body["group"]}
        )

    def _pretrain(self, task_id: str, task: _Task, weights: np.ndarray) -> None:
        assert self.model is not None
        b = task.body
        result = self._in_worker(
            self.model.train,
            self.train_data.x,
            self.train_data.y,
            epochs=10_000,
            batch_size=int(b.get("batch", 10)),
            lr=float(b.get("lr", 0.01)),
            max_steps=int(b.get("steps", 50)),
            seed=np.random.default_rng(self._task_seed(task)),
            initial_weights=weights,
        )
        self._done_tasks.add(task_id)
        update = (result.weights - weights).astype(np.float32)
        for frame in encode_frames(
            update,
            kind="update",
            run=self.cfg.run,
            round=task.round,
            group=-1,
            sender=self.cfg.device_id,
            max_chunk=self.cfg.max_chunk,
            extra={"task_id": task_id},
        ):
            self.link.publish(self.topics.server_frames, frame)

    def _evaluate(self, task_id: str, task: _Task, models: dict[int, np.ndarray]) -> None:
        assert self.model is not None
        self._waiting.pop(task_id, None)
        self._eval_models.pop(task_id, None)
        split = self.test_data if task.body.get("split") == "test" and self.test_data else self.train_data
        model = self.model

        def evaluate_all() -> list[dict[str, Any]]:
            rows = []
            for index in sorted(models):
                model.set_weights(models[index])
                ev = model.evaluate(split.x, split.y)
                rows.append({"index": index, "loss": ev.loss, "correct": ev.n_correct, "n": ev.n_samples})
            return rows

        rows = self._in_worker(evaluate_all)
        self._done_tasks.add(task_id)
        self._send(
            Message("result", self.cfg.run, self.cfg.device_id, task.round, {"task_id": task_id, "evaluations": rows})
        )

    def _in_worker(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A model call in the background-priority model thread (``device/worker.py``)."""
        return self.worker.run(fn, *args, keep_waiting=lambda: self.running, **kwargs)

    def close(self) -> None:
        self.worker.close()
        with contextlib.suppress(TransportError):
            self.link.publish(self.topics.status(self.cfg.device_id), b"offline", retain=True, wait=2.0)
        self.link.close()

    def stats_dict(self) -> dict[str, Any]:
        return asdict(self.stats)


def _available_memory_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def load_device_data(path: Path, user: str | None, test: Path | None) -> tuple[Dataset, Dataset | None]:
    """A device's train (and optional test) set from LEAF, .npz or .csv."""
    from device.data import read_dataset

    train = read_dataset(path, user=user)
    if len(train) == 0:
        raise DataError(f"{path} holds no training samples for this device")
    return train, read_dataset(test, user=user) if test else None
