"""The coordinator: device registry, rounds, group managers, evaluation, checkpoints.

It drives any :class:`Strategy` exactly as the simulator does, by implementing the
strategy's :class:`RoundContext` over MQTT: pre-training requests, loss evaluations
and class counts go to devices and come back as messages and frames. Every receive is
validated; a malformed message, an unknown device, a stale round or a hand-off from
the wrong sender is dropped with a log line and counted in the round's metrics.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device.data import Dataset
from device.errors import CoveyError, ModelError, ProtocolError, TransportError
from device.manifest import Manifest, load_manifest, manifest_path_for
from device.mqtt import Incoming, MqttLink, TlsFiles
from device.protocol import (
    SERVER_ID,
    Message,
    Payload,
    Reassembler,
    Topics,
    check_weights,
    decode_message,
    encode_frames,
)
from device.runtime import TFLiteModel
from server.artifact import device_artifact
from server.coordinator import checkpoint
from server.coordinator.manager import GroupManager
from server.coordinator.shared import SharedModels
from server.strategies.base import ClientInfo, GroupResult, RoundPlan, Strategy

log = logging.getLogger("covey.server")


@dataclass
class CoordinatorConfig:
    run: str
    host: str
    port: int
    state_dir: Path
    handoff: str = "auto"  # auto | direct | relay | mixed
    deadline_s: float = 120.0
    seed: int = 0
    max_chunk: int = 900_000
    relay_rtt_ms: float = 250.0
    federated_eval_every: int = 0  # evaluate on the devices' own test sets every N rounds (0: never)
    # partial model payloads held at once: a parallel round has one in flight per device
    max_pending_mb: int = 4096
    username: str | None = None
    password: str | None = None
    tls: TlsFiles | None = None


@dataclass
class DeviceRecord:
    info: ClientInfo
    runtime: str
    rtt_ms: float = float("nan")
    last_seen: float = 0.0
    direct: bool = True


@dataclass
class RoundMetrics:
    round: int
    test_accuracy: float
    test_loss: float
    train_loss: float
    n_groups: int
    participants: int
    trained: int
    skipped: int
    handoff: dict[str, int]
    dropped: dict[str, int]
    wall_s: float
    extra: dict[str, float] = field(default_factory=dict)


class Coordinator:
    def __init__(
        self,
        config: CoordinatorConfig,
        strategy: Strategy,
        model_path: Path,
        eval_data: Dataset | None = None,
    ) -> None:
        self.cfg = config
        self.strategy = strategy
        self.topics = Topics(config.run)
        self.model_path = Path(model_path)
        self.manifest: Manifest = load_manifest(manifest_path_for(self.model_path))
        self.model = TFLiteModel(self.model_path, self.manifest)
        self.eval_data = eval_data
        self.devices: dict[str, DeviceRecord] = {}
        self.metrics: list[RoundMetrics] = []
        self.rng = np.random.default_rng(config.seed)
        self.round = 0
        self._frames = Reassembler(max_pending_bytes=config.max_pending_mb * 2**20)
        self._dropped: dict[str, int] = {}
        self._managers: list[GroupManager] = []
        self._pending: dict[str, dict[str, Any]] = {}  # task id -> waiter for pretrain / evaluate replies
        self._started = False
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.link = MqttLink(
            f"covey-{config.run}-server",
            config.host,
            config.port,
            username=config.username,
            password=config.password,
            tls=config.tls,
            clean_session=True,
        )
        self.shared = SharedModels(
            self.topics, lambda topic, data, retain: self.link.publish(topic, data, retain=retain), config.max_chunk
        )

    # -- setup ----------------------------------------------------------------------------
    def connect(self, timeout: float = 15.0) -> None:
        self.link.connect(timeout)
        t = self.topics
        self.link.subscribe(t.register, t.results, t.server_frames, f"{t.root}/group/+/frames")
        self.publish_artifact()

    def publish_artifact(self) -> None:
        """The model and its manifest, retained, so a board needs no model files.

        Devices get the model without its initial values (``server/artifact.py``):
        every request brings the weights to start from, and the FEMNIST CNN's
        download shrinks from 29 MB to 3 MB and its training peak by about 50 MB.
        """
        model_bytes = self.model_path.read_bytes()
        manifest = self.manifest.to_dict()
        try:
            model_bytes, manifest = device_artifact(model_bytes, manifest)
        except ModelError as exc:
            log.warning("publishing %s with its initial values: %s", self.model_path.name, exc)
        data = np.frombuffer(model_bytes, np.uint8)
        for i, frame in enumerate(
            encode_frames(
                data,
                kind="artifact",
                run=self.cfg.run,
                round=0,
                group=-1,
                sender=SERVER_ID,
                max_chunk=self.cfg.max_chunk,
            )
        ):
            self.link.publish(self.topics.artifact_chunk(i), frame, retain=True)
        self.link.publish(self.topics.artifact_manifest, json.dumps(manifest).encode(), retain=True, wait=30.0)

    def _drop(self, reason: str, detail: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        log.warning("dropped: %s (%s)", reason, detail)

    # -- receiving ------------------------------------------------------------------------
    def pump(self, timeout: float) -> None:
        """Handle one incoming message (if any arrives within ``timeout``)."""
        item = self.link.receive(timeout)
        if item is None:
            return
        try:
            self._dispatch(item)
        except CoveyError as exc:
            self._drop(type(exc).__name__, f"{item.topic}: {exc}")

    def _dispatch(self, item: Incoming) -> None:
        t = self.topics
        if item.topic == t.register:
            self._on_register(decode_message(item.payload))
        elif item.topic == t.results:
            self._on_result(decode_message(item.payload))
        elif item.topic == t.server_frames or (
            item.topic.startswith(f"{t.root}/group/") and item.topic.endswith("/frames")
        ):
            evicted = self._frames.evicted
            payload = self._frames.add(item.payload)
            if self._frames.evicted > evicted:
                self._drop("evicted partial payload", f"over {self.cfg.max_pending_mb} MB of partial model payloads")
            if payload is not None:
                self._on_frame(payload)
        else:
            raise ProtocolError(f"unexpected topic {item.topic}")

    def _on_register(self, msg: Message) -> None:
        if msg.run != self.cfg.run:
            raise ProtocolError(f"registration for run {msg.run!r}")
        b = msg.body
        counts = np.asarray(b.get("class_counts", []), np.float64)
        if counts.shape != (self.manifest.n_classes,) or (counts < 0).any() or not np.isfinite(counts).all():
            if b.get("runtime") == "pending":
                return  # a device re-registers once it has the model; counts fit then
            raise ProtocolError(
                f"{msg.sender}: class counts of shape {counts.shape}, model has {self.manifest.n_classes} classes"
            )
        info = ClientInfo(msg.sender, int(b.get("n_samples", 0)), counts, int(b.get("n_test", 0)))
        known = msg.sender in self.devices
        self.devices[msg.sender] = DeviceRecord(
            info, str(b.get("runtime")), direct=bool(b.get("direct", True)), last_seen=time.monotonic()
        )
        if known:
            log.info("device %s registered again", msg.sender)
        else:
            log.info("device %s registered: %d samples, %s", msg.sender, info.n_samples, b.get("runtime"))
            if self._started:
                self.strategy.add_client(info)  # a newcomer

    def _known(self, sender: str) -> DeviceRecord:
        rec = self.devices.get(sender)
        if rec is None:
            raise ProtocolError(f"message from unknown device {sender!r}")
        rec.last_seen = time.monotonic()
        return rec

    def _on_result(self, msg: Message) -> None:
        rec = self._known(msg.sender)
        if msg.type == "pong":
            sent = msg.body.get("echo")
            if isinstance(sent, (int, float)):
                rec.rtt_ms = (time.time() - float(sent)) * 1000
            return
        if msg.type != "result":
            raise ProtocolError(f"{msg.type!r} is not a result")
        counts = msg.body.get("class_counts")
        if isinstance(counts, list) and len(counts) == self.manifest.n_classes:
            rec.info = ClientInfo(
                rec.info.client_id, rec.info.n_samples, np.asarray(counts, np.float64), rec.info.n_test
            )
        task_id = str(msg.body.get("task_id", ""))
        if task_id in self._pending:
            self._pending[task_id]["result"] = msg.body
            return
        if msg.round != self.round:
            raise ProtocolError(f"result of round {msg.round} from {msg.sender}; the current round is {self.round}")
        for manager in self._managers:
            if manager.owns(msg.sender) and manager.on_result(msg.sender, msg.body, time.monotonic()):
                return
        raise ProtocolError(f"result from {msg.sender} for task {task_id!r} that no group expects")

    def _on_frame(self, payload: Payload) -> None:
        h = payload.header
        self._known(h.sender)
        weights = check_weights(payload, self.manifest.n_params)
        task_id = str(h.extra.get("task_id", ""))
        if h.kind == "update":
            if task_id not in self._pending:
                raise ProtocolError(f"update for task {task_id!r} nobody waits for")
            self._pending[task_id]["update"] = weights
            return
        if h.round != self.round:
            raise ProtocolError(f"{h.kind} frame of round {h.round} from {h.sender}; current round is {self.round}")
        for manager in self._managers:
            if manager.plan.group_id == h.group and manager.on_frame(payload, weights, time.monotonic()):
                return
        raise ProtocolError(f"{h.kind} frame from {h.sender} that group {h.group} does not expect")

    # -- waiting -------------------------------------------------------------------------
    def wait_for_devices(self, n: int, timeout: float, progress: Callable[[int], None] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ready_devices()) < n:
            if time.monotonic() > deadline:
                raise TransportError(
                    f"only {len(self.ready_devices())} of {n} devices registered within {timeout:.0f} s"
                )
            self.pump(0.2)
            if progress:
                progress(len(self.ready_devices()))

    def ready_devices(self) -> list[str]:
        return sorted(d for d, r in self.devices.items() if r.runtime != "pending")

    def measure_rtt(self, timeout: float = 5.0) -> None:
        """Ping every device; RTT is measured from the pong (through the broker)."""
        for device in self.ready_devices():
            msg = Message("ping", self.cfg.run, SERVER_ID, self.round, {"t": time.time()})
            self.link.publish(self.topics.inbox(device), msg.encode())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(np.isnan(self.devices[d].rtt_ms) for d in self.ready_devices()):
            self.pump(0.1)

    # -- RoundContext ---------------------------------------------------------------------
    def clients(self) -> Sequence[ClientInfo]:
        return [self.devices[d].info for d in self.ready_devices()]

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {c: self.devices[c].info.class_counts for c in client_ids}

    def snr_matrix(self) -> np.ndarray | None:
        return None  # boards report no SNR through a portable API yet; DSC then groups by data only

    def distance_matrix(self) -> np.ndarray | None:
        ids = self.ready_devices()
        rtt = np.array([self.devices[d].rtt_ms for d in ids])
        if np.isnan(rtt).all():
            return None
        rtt = np.nan_to_num(rtt, nan=float(np.nanmax(rtt)))
        dist = rtt[:, None] + rtt[None, :]  # device -> broker -> device
        np.fill_diagonal(dist, 0.0)
        return dist

    def _request_with_models(
        self, kind: str, client_ids: Sequence[str], models: Sequence[np.ndarray], body: dict[str, Any]
    ) -> dict[str, dict[str, Any]]:
        tasks = {}
        # several devices: one retained copy of each model that they all fetch
        shared = (
            [self.shared.publish(m, round_=self.round, group=-1, label=f"{kind}{i}") for i, m in enumerate(models)]
            if len(client_ids) > 1
            else []
        )
        for c in client_ids:
            task_id = f"{self.cfg.run}-{kind}-{self.round}-{c}-{self.rng.integers(1 << 30)}"
            tasks[task_id] = c
            self._pending[task_id] = {}
            extra_body = {"shared": shared} if shared else {}
            msg = Message(kind, self.cfg.run, SERVER_ID, self.round, {"task_id": task_id, **body, **extra_body})
            self.link.publish(self.topics.inbox(c), msg.encode())
            for i, m in enumerate(models if not shared else ()):
                for frame in encode_frames(
                    m,
                    kind="model",
                    run=self.cfg.run,
                    round=self.round,
                    group=-1,
                    sender=SERVER_ID,
                    max_chunk=self.cfg.max_chunk,
                    extra={"task_id": task_id, "index": i},
                ):
                    self.link.publish(self.topics.frames(c), frame)
        key = "update" if kind == "pretrain" else "result"
        deadline = time.monotonic() + self.cfg.deadline_s
        try:
            while time.monotonic() < deadline and any(key not in self._pending[t] for t in tasks):
                self.pump(0.1)
        finally:
            self.shared.clear(*shared)
        out = {tasks[t]: self._pending.pop(t) for t in list(tasks)}
        missing = [c for c, v in out.items() if key not in v]
        if missing:
            log.warning("%s: no reply from %s before the deadline", kind, missing)
        return out

    def pretrain(self, client_ids: Sequence[str], weights: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        t = self.strategy.train
        replies = self._request_with_models(
            "pretrain",
            client_ids,
            [weights],
            {"steps": steps, "batch": t.batch_size, "lr": t.lr, "seed": self.cfg.seed},
        )
        return {c: v["update"] for c, v in replies.items() if "update" in v}

    def losses(self, client_ids: Sequence[str], models: Sequence[np.ndarray]) -> np.ndarray:
        replies = self._request_with_models("evaluate", client_ids, models, {"n_models": len(models), "split": "train"})
        out = np.full((len(client_ids), len(models)), np.inf)
        for i, c in enumerate(client_ids):
            for row in replies[c].get("result", {}).get("evaluations", []):
                out[i, int(row["index"])] = float(row["loss"])
        return out

    # -- rounds ---------------------------------------------------------------------------
    def _handoff_for(self, group_index: int, members: Sequence[str]) -> str:
        mode = self.cfg.handoff
        if mode == "mixed":
            return "direct" if group_index % 2 == 0 else "relay"
        if mode in ("direct", "relay"):
            return mode
        slow = [d for d in members if not self.devices[d].direct or self.devices[d].rtt_ms > self.cfg.relay_rtt_ms]
        return "relay" if slow else "direct"

    def _execute(self, plan: RoundPlan) -> list[GroupResult]:
        unknown = sorted({d for g in plan.groups for d in g.members if d not in self.devices})
        if unknown:
            raise ProtocolError(f"plan names unknown devices {unknown}")
        now = time.monotonic()
        self._managers = []
        try:
            for i, g in enumerate(plan.groups):
                manager = GroupManager(
                    g,
                    plan.round,
                    plan.models[g.start_model],
                    plan.train,
                    topics=self.topics,
                    publish=lambda topic, data: self.link.publish(topic, data),
                    handoff=self._handoff_for(i, g.members),
                    deadline_s=self.cfg.deadline_s,
                    seed=self.cfg.seed,
                    max_chunk=self.cfg.max_chunk,
                    shared=self.shared,
                )
                for d in g.members:
                    self.link.publish(
                        self.topics.assignment(d),
                        json.dumps({"run": self.cfg.run, "round": plan.round, "group": g.group_id}).encode(),
                        retain=True,
                    )
                self._managers.append(manager)
                manager.start(now)
            while not all(m.done for m in self._managers):
                self.pump(0.05)
                now = time.monotonic()
                for m in self._managers:
                    m.tick(now)
        finally:
            for m in self._managers:
                m.release()  # no shared start model outlives its round on the broker
        return [m.result() for m in self._managers]

    def evaluate(self) -> tuple[float, float]:
        if self.eval_data is None or self.strategy.global_weights is None:
            return float("nan"), float("nan")
        self.model.set_weights(self.strategy.global_weights)
        ev = self.model.evaluate(self.eval_data.x, self.eval_data.y)
        return ev.accuracy, ev.loss

    def federated_evaluate(self) -> tuple[float, float]:
        """Weighted accuracy and loss of each device's current model on its own test set."""
        by_model: dict[int, tuple[np.ndarray, list[str]]] = {}
        for d in self.ready_devices():
            m = self.strategy.model_for(d)
            by_model.setdefault(id(m), (m, []))[1].append(d)
        correct = loss = n = 0.0
        for model, devices in by_model.values():
            replies = self._request_with_models("evaluate", devices, [model], {"n_models": 1, "split": "test"})
            for reply in replies.values():
                for row in reply.get("result", {}).get("evaluations", []):
                    correct += float(row["correct"])
                    loss += float(row["loss"]) * float(row["n"])
                    n += float(row["n"])
        return (correct / n, loss / n) if n else (float("nan"), float("nan"))

    def setup_strategy(self) -> None:
        initial = self.model.get_weights()
        self.strategy.setup(self.clients(), initial, self.rng)
        self._started = True

    def step(self) -> RoundMetrics:
        self.round += 1
        start = time.monotonic()
        self._dropped = {}
        plan = self.strategy.plan_round(self.round, self)
        results = self._execute(plan)
        summary = self.strategy.aggregate(self.round, plan, results)
        acc, loss = self.evaluate()
        extra = dict(summary.extra)
        if self.cfg.federated_eval_every and self.round % self.cfg.federated_eval_every == 0:
            extra["federated_accuracy"], extra["federated_loss"] = self.federated_evaluate()
        handoffs: dict[str, int] = {}
        for m in self._managers:
            if m.plan.mode == "chain":
                handoffs[m.handoff] = handoffs.get(m.handoff, 0) + 1
        metrics = RoundMetrics(
            self.round,
            acc,
            loss,
            summary.train_loss,
            len(plan.groups),
            len(plan.participants),
            sum(len(m.trained_members) for m in self._managers),
            sum(len(r.skipped) for r in results),
            handoffs,
            dict(self._dropped),
            time.monotonic() - start,
            extra,
        )
        self.metrics.append(metrics)
        self.checkpoint()
        log.info(
            "round %d: accuracy %.2f%% loss %.3f, %d groups, %d trained, %d skipped, %.1f s",
            self.round,
            100 * acc,
            loss,
            metrics.n_groups,
            metrics.trained,
            metrics.skipped,
            metrics.wall_s,
        )
        return metrics

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Round, registry, metrics and the strategy's state (JSON + npz, no pickle)."""
        d = self.cfg.state_dir
        checkpoint.save(
            {
                "round": self.round,
                "strategy": self.strategy,
                "devices": self.devices,
                "metrics": [asdict(m) for m in self.metrics],
            },
            d,
        )
        (d / "metrics.json").write_text(json.dumps([asdict(m) for m in self.metrics], indent=1, default=float) + "\n")

    def resume(self) -> bool:
        state = checkpoint.load(self.cfg.state_dir)
        if state is None:
            return False
        self.strategy, self.round = state["strategy"], int(state["round"])
        self.devices.update(state.get("devices", {}))  # devices registered before the restart
        self.metrics = [RoundMetrics(**m) for m in state["metrics"]]
        self._started = True
        log.info("resumed from the checkpoint of round %d", self.round)
        return True

    def stop_devices(self) -> None:
        for d in self.devices:
            self.link.publish(self.topics.inbox(d), Message("stop", self.cfg.run, SERVER_ID, self.round).encode())

    def close(self) -> None:
        self.link.close()
