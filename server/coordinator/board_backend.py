"""The round driver's backend on boards: what :class:`~server.rounds.RoundDriver`
asks of devices, answered over the bus.

The simulator answers the same questions from virtual devices
(:class:`~server.simulation.engine.VirtualDevices`); the driver cannot tell the two
apart. Here a plan runs through the group managers
(:class:`~server.execution.round.RoundExecution`), pre-training and evaluation
through requests (:class:`~server.coordinator.requests.TaskRequests`), class counts come
from the registry, and link matrices from the link prober.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from device.protocol import EvalRow
from server.backend import EvalJob, RoundStats
from server.coordinator.bus import DeviceBus
from server.coordinator.prober import LinkProber
from server.coordinator.registry import Registry
from server.coordinator.requests import TaskRequests
from server.edge.proxy import EdgeBook
from server.execution.round import RoundExecution
from server.hops import HopBound
from server.strategies.base import ClientInfo, GroupResult, RoundPlan

# How long a board's last will must stand before rounds are planned without it: longer
# than an agent takes to reconnect after its connection drops (it retries within seconds)
OFFLINE_GRACE_S = 15.0


class BoardBackend:
    """:class:`~server.backend.Backend` over registered boards.

    Parameters
    ----------
    registry : the devices that registered and passed admission.
    execution : runs a plan's groups.
    requests : pre-training and evaluation requests.
    prober : the measured links.
    bus : its drops, reported with each round.
    """

    def __init__(
        self,
        registry: Registry,
        execution: RoundExecution,
        requests: TaskRequests,
        prober: LinkProber,
        bus: DeviceBus,
    ) -> None:
        self.registry, self.execution, self.requests, self.prober, self.bus = (
            registry,
            execution,
            requests,
            prober,
            bus,
        )
        self.round = 0  # the round being run: results of any other are not this round's

    def ready_devices(self) -> list[str]:
        return sorted(self.registry.devices)

    def clients(self) -> Sequence[ClientInfo]:
        return [self.registry.devices[d].info for d in self.ready_devices()]

    def before_round(self, rnd: int) -> dict[str, float]:
        self.round = rnd
        return {}

    def execute(self, plan: RoundPlan, *, seed: int, hop: HopBound | None = None) -> list[GroupResult]:
        return self.execution.run(plan, seed, hop)

    def pretrain(
        self, client_ids: Sequence[str], weights: np.ndarray, *, steps: int, batch: int, lr: float, seed: int, rnd: int
    ) -> dict[str, np.ndarray]:
        return self.requests.pretrain(client_ids, weights, steps=steps, batch=batch, lr=lr, seed=seed, rnd=rnd)

    def evaluate(self, jobs: Sequence[EvalJob], *, rnd: int) -> list[dict[str, list[EvalRow]]]:
        return self.requests.evaluate(jobs, rnd=rnd)

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {c: self.registry.devices[c].info.class_counts for c in client_ids}

    def snr_matrix(self) -> np.ndarray | None:
        """Γ over the current devices (sorted), from the link measurements."""
        return self.prober.snr_matrix()

    def links_record(self) -> dict[str, Any] | None:
        return self.prober.record()

    def distance_matrix(self) -> np.ndarray | None:
        """The RTT matrix over the current devices: measured between peers where
        measured, else through the server (``rtt_i + rtt_j``)."""
        rtt = self.prober.rtt_matrix()
        return rtt if rtt is not None else self.registry.distance_matrix()

    def site_edges(self) -> dict[str, str]:
        book = self.execution.placement
        if not isinstance(book, EdgeBook):
            return {}
        return {d: name for name, devices in book.edges.items() for d in devices}

    def offline(self) -> frozenset[str]:
        """Boards whose last will came at least :data:`OFFLINE_GRACE_S` ago: a connection
        that drops and comes back (an agent reconnects within seconds, its session kept by
        the broker) keeps its board in the plans."""
        return self.registry.offline_for(OFFLINE_GRACE_S)

    def round_stats(self) -> RoundStats:
        by_reason, by_device = self.bus.take_drops()
        return RoundStats(
            self.execution.handoff_counts(),
            by_reason,
            by_device,
            resends=self.execution.resends(),
            server_bytes=self.execution.payload_bytes(),
        )
