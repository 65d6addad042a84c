"""The coordinator: a run on boards over MQTT, composed of its collaborators.

It publishes the model artifact and a retained status with a per-process *epoch*
(devices register again when a new coordinator appears), and drives rounds: each
:meth:`Coordinator.step` is the round driver's step (:mod:`server.rounds`), then the
checkpoint, the acknowledgements and the sweep of retained junk.

It hands each collaborator what it needs, never itself: the MQTT side
(:class:`~server.coordinator.bus.DeviceBus`: identity, reassembly, de-duplication,
drops and the memory bounds), what arrives from devices
(:class:`~server.coordinator.inbox.Inbox`), the driver's backend
(:class:`~server.coordinator.board_backend.BoardBackend`), plan execution
(:class:`~server.execution.round.RoundExecution`), link measurement
(:class:`~server.coordinator.prober.LinkProber`), checkpoints
(:class:`~server.coordinator.persistence.Persistence`), requests, shared models and the
retained-junk sweep. The registry holds at most ``max_devices`` devices and 256
registrations waiting for their confirmation ping.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from device.data import Dataset
from device.errors import TransportError
from device.manifest import Manifest, load_manifest, manifest_path_for
from device.mqtt import MqttLink, Will
from device.protocol import (
    SERVER_ID,
    Ack,
    Message,
    Stop,
    Topics,
)
from device.runtime import TFLiteModel
from device.transport import LinkFactory
from server.backend import RoundRecord
from server.coordinator.board_backend import BoardBackend
from server.coordinator.bus import DeviceBus
from server.coordinator.config import CoordinatorConfig
from server.coordinator.inbox import Inbox, InboxSettings
from server.coordinator.persistence import Persistence
from server.coordinator.prober import LinkProber
from server.coordinator.registry import DeviceRecord, Registry
from server.coordinator.requests import TaskRequests
from server.coordinator.retained import RetainedJunk
from server.downlink import downlinks_for
from server.edge.proxy import EdgeBook
from server.execution.ports import PolledBus
from server.execution.round import RoundExecution
from server.execution.shared import SharedModels
from server.links import LinkMatrices
from server.presence import Presence
from server.reference import server_norm
from server.rounds import RoundDriver
from server.strategies.base import ClientInfo, RoundPlan, Strategy

log = logging.getLogger("covey.server")


class Coordinator:
    """One run on boards (module docstring): it composes its collaborators, hands each
    what it needs, and drives rounds with :meth:`step` (plan, execute, aggregate, then
    checkpoint and acknowledge)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        strategy: Strategy,
        model_path: Path,
        eval_data: Dataset | None = None,
        *,
        link_factory: LinkFactory = MqttLink,
    ) -> None:
        """``link_factory``: how to reach the broker (``MqttLink``; the in-process
        broker of ``server/loopback.py`` runs the coordinator and agents in one process)."""
        self.cfg = config
        self.topics = Topics(config.run)
        self.model_path = Path(model_path)
        self.manifest: Manifest = load_manifest(manifest_path_for(self.model_path))
        self.model = TFLiteModel(self.model_path, self.manifest)
        self.eval_data = eval_data
        self.epoch = uuid.uuid4().hex[:8]  # this process; task ids and shared keys carry it
        self.presence = Presence.of_model(self.model_path, self.manifest, self.topics, self.epoch, config.max_chunk)
        self.registry = Registry(self.manifest.n_classes, config.admission())
        model_bytes = 4 * self.manifest.n_params  # every frame a device sends carries one float32 model
        self.bases: dict[str, np.ndarray] = {}  # this round's start models, by the sha256 of their payload
        self.downlinks = downlinks_for(config.codec, self.registry.decodes)  # int8/int4: what devices hold
        self._started = False
        self._resumed_plan: RoundPlan | None = None
        self.bus = DeviceBus(
            config.bus_settings(),
            self.topics,
            model_bytes=model_bytes,
            will=Will(self.topics.server_status, self.presence.status("stopped"), retain=True),
            registered=self.registry.devices,
            link_factory=link_factory,
        )
        self.link = self.bus.link
        self.shared = SharedModels(self.topics, self._publish, config.max_chunk, self.epoch)
        self.retained = RetainedJunk(
            self.topics,
            self._publish,
            lambda topic: self.link.subscribe(topic),
            lambda topic: self.link.unsubscribe(topic),
            # counted against a registered device only (any id can be written on an open broker)
            lambda reason, detail, device: self.bus.drops.drop(
                reason, detail, device if device in self.devices else None
            ),
        )
        self.requests = TaskRequests(
            self.topics,
            self._publish,
            self.shared,
            self.pump,
            deadline_s=config.deadline_s,
            max_chunk=config.max_chunk,
            task_prefix=self.epoch,
        )
        self.edges = (
            EdgeBook(
                {name: frozenset(devices) for name, devices in config.edges.items()},
                self.topics,
                self._publish,
                config.deadline_s,
                config.max_chunk,
                config.codec,
                bases=self.bases,
                downlinks=self.downlinks,
            )
            if config.edges
            else None
        )
        self.execution = RoundExecution(
            config.execution_settings(),
            topics=self.topics,
            bus=PolledBus(self._publish, self.pump),
            clock=time.monotonic,
            known=self.registry.devices,
            shared=self.shared,
            bases=self.bases,
            downlinks=self.downlinks,
            task_prefix=self.epoch,
            placement=self.edges,
        )
        self.prober = LinkProber(
            config.probe_settings(),
            run=config.run,
            topics=self.topics,
            publish=self._publish,
            wait=self.pump,
            devices=self.registry.devices,
            task_prefix=self.epoch,
            model_bytes=model_bytes,
        )
        self.backend = BoardBackend(self.registry, self.execution, self.requests, self.prober, self.bus)
        self.inbox = Inbox(
            InboxSettings(config.run, config.codec, self.manifest.n_classes, self.manifest.n_params),
            topics=self.topics,
            publish=self._publish,
            bus=self.bus,
            registry=self.registry,
            prober=self.prober,
            execution=self.execution,
            requests=self.requests,
            retained=self.retained,
            bases=self.bases,
            current_round=lambda: self.backend.round,
            on_client=self._on_client,
            edges=self.edges,
        )
        self.on_pump: Callable[[], None] | None = None  # called after every pump (server/dashboard/feed.py)
        self.driver = RoundDriver(
            strategy,
            self.backend,
            seed=config.seed,
            federated_eval_every=config.federated_eval_every,
            server_eval=self._server_eval if eval_data is not None else None,
            max_attempts=config.round_attempts,
            screening=config.screening,
            # the server's own update on its held-out data: screening's reference when a round
            # has one or two chains (server/reference.py)
            reference=server_norm(model_path, eval_data) if eval_data is not None else None,
        )
        self.persistence = Persistence(config.state_dir, self.driver, self.registry)
        self.driver.on_planned = self.persistence.journaler(self.execution.next_prefix)

    @property
    def strategy(self) -> Strategy:
        return self.driver.strategy

    @property
    def devices(self) -> dict[str, DeviceRecord]:
        return self.registry.devices

    @property
    def records(self) -> list[RoundRecord]:
        return self.driver.records

    @property
    def round(self) -> int:
        """The round being run (0 before round 1)."""
        return self.backend.round

    @round.setter
    def round(self, rnd: int) -> None:
        self.backend.round = rnd

    def _on_client(self, info: ClientInfo) -> None:
        """A device passed admission, or registered new counts: the strategy hears of it
        once the run has started (before, setup reads every registered device)."""
        if self._started:
            self.driver.add_client(info)

    def checkpoint(self) -> None:
        self.persistence.checkpoint()

    def resume(self) -> bool:
        """Continue from the last checkpoint (and finish a round the journal shows was in
        progress, with its plan and task ids); False when there is nothing to resume."""
        resumed = self.persistence.resume()
        if resumed is None:
            return False
        self.round = resumed.done
        self._started = True
        detail = f"from the checkpoint after round {resumed.done}" + (
            ", finishing the journaled round" if resumed.plan is not None else ""
        )
        self.inbox.run_events.append({"round": resumed.done + 1, "kind": "resumed", "detail": detail})
        if resumed.plan is not None:
            self._resumed_plan = resumed.plan
            self.execution.task_prefix = resumed.task_prefix or self.execution.task_prefix
        return True

    # -- setup ----------------------------------------------------------------------------
    def _publish(self, topic: str, data: bytes, retain: bool = False) -> None:
        self.bus.publish(topic, data, retain)

    def connect(self, timeout: float = 15.0) -> None:
        t = self.topics
        self.bus.connect(
            timeout,
            t.from_filter("register"),
            t.from_filter("results"),
            t.from_filter("frames"),
            t.from_filter("status"),
            f"{t.root}/server/register",  # protocol-1 devices register here: they are told to upgrade
        )
        # the model and its manifest, then the running status, retained (server/presence.py)
        self.presence.publish(self._publish, lambda topic, data: self.link.publish(topic, data, retain=True, wait=30.0))

    # -- receiving ------------------------------------------------------------------------
    @property
    def run_events(self) -> list[dict[str, object]]:
        """What happened to the run itself: resumed from a checkpoint, reconnected."""
        return self.inbox.run_events

    def pump(self, timeout: float) -> None:
        """Handle one incoming message (if any arrives within ``timeout``): :class:`Inbox`;
        then ``on_pump`` (the dashboard's feed), if set, on this thread."""
        self.inbox.pump(timeout)
        if self.on_pump is not None:
            self.on_pump()

    # -- waiting -------------------------------------------------------------------------
    def wait_for_devices(self, n: int, timeout: float, progress: Callable[[int], None] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while len(self.devices) < n:
            if time.monotonic() > deadline:
                raise TransportError(f"only {len(self.devices)} of {n} devices registered within {timeout:.0f} s")
            self.pump(0.2)
            if progress:
                progress(len(self.devices))

    def measure_rtt(self, timeout: float = 5.0) -> None:
        """Ping every device; RTT is measured from the pong (through the broker)."""
        self.prober.measure_rtt(self.round, timeout)

    def measure_links(self, timeout: float | None = None) -> LinkMatrices:
        """Measure Γ and the RTT matrix (:meth:`LinkProber.measure`)."""
        return self.prober.measure(self.round, timeout)

    def _server_eval(self, weights: np.ndarray) -> tuple[float, float]:
        assert self.eval_data is not None
        self.model.set_weights(weights)
        ev = self.model.evaluate(self.eval_data.x, self.eval_data.y)
        return ev.accuracy, ev.loss

    # -- rounds ---------------------------------------------------------------------------
    def setup_strategy(self) -> None:
        self.driver.setup(self.model.get_weights(), self.manifest.tensor_sizes())
        self._started = True

    def step(self) -> RoundRecord:
        """One round; a round journaled before a crash is finished, not planned again.
        After the checkpoint every member's task is acknowledged, so devices forget the
        results they held for it."""
        planned, self._resumed_plan = self._resumed_plan, None
        record = self.driver.step(planned)
        self.checkpoint()
        self._acknowledge()
        self.retained.sweep(self.pump)  # what devices parked on hand-off topics (server/coordinator/retained.py)
        self.execution.task_prefix = self.epoch
        every = self.cfg.links_every
        if every > 0 and record.round % every == 0:
            self.measure_links()  # links change: a refresh before the strategy regroups
        else:
            self.prober.refresh()
        log.info(
            "round %d: server accuracy %.2f%%, federated %.2f%%, %d group(s), %d trained, %d skipped, %.1f s",
            record.round,
            100 * record.server_accuracy,
            100 * record.federated_accuracy,
            record.n_groups,
            record.trained,
            record.skipped,
            record.wall_s,
        )
        return record

    def run_rounds(
        self,
        n_devices: int,
        rounds: int,
        *,
        register_timeout: float = 120.0,
        on_ready: Callable[[], None] | None = None,
    ) -> list[RoundRecord]:
        """A whole run without a user in front of it (harnesses, benchmarks): connect,
        wait for ``n_devices``, set the strategy up, call ``on_ready`` (a benchmark
        starts its clocks and meters there), ``rounds`` rounds, stop the devices; the
        link is closed however it ends. ``covey server run`` adds resume, link
        measurement, progress and results files around the same steps (server/serve.py)."""
        try:
            self.connect()
            self.wait_for_devices(n_devices, timeout=register_timeout)
            self.setup_strategy()
            if on_ready is not None:
                on_ready()
            self.driver.last_round = rounds
            records = [self.step() for _ in range(rounds)]
            self.stop_devices()
            return records
        finally:
            self.close()

    def _acknowledge(self) -> None:
        for device, task_ids in self.execution.task_ids().items():
            msg = Message.of(Ack(tuple(task_ids)), run=self.cfg.run, sender=SERVER_ID, round=self.round)
            self._publish(self.topics.inbox(device), msg.encode())

    def stop_devices(self, reason: str = "the run is over") -> None:
        for d in self.devices:
            self._publish(self.topics.inbox(d), Message.of(Stop(reason), run=self.cfg.run, sender=SERVER_ID).encode())

    def close(self) -> None:
        self.bus.close(self.presence.status("stopped"))
