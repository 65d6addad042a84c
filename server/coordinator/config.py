"""The coordinator's settings: one run on boards (``covey server run`` fills them from
its flags, ``server/serve.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from device.mqtt import TlsFiles
from device.protocol import WireCodec
from server.coordinator.admission import Admission
from server.coordinator.bus import BusSettings
from server.coordinator.prober import ProbeSettings
from server.execution.round import ExecutionSettings
from server.links import DEFAULT_BANDWIDTH_HZ
from server.screening import ScreeningConfig


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
    relay_rtt_ms: float = 250.0  # unused: `auto` relays every chain (server/hops.py); kept for old configs
    federated_eval_every: int = 0  # evaluate on the devices' own test sets every N rounds (0: never)
    # partial model payloads held at once: a parallel round has one in flight per device
    # (each device may hold two models' worth, and only registered devices any)
    max_pending_mb: int = 4096
    # payload bytes waiting in the receive queue (beyond: dropped and counted)
    max_queue_mb: int = 2048
    username: str | None = None
    password: str | None = None
    tls: TlsFiles | None = None
    # admission control (server/coordinator/admission.py): the provisioned ids of a site
    # run (None: anyone may register), a cap, and confirmation pings per second
    allowed_devices: frozenset[str] | None = None
    max_devices: int = 1000
    max_registrations_per_s: float = 20.0
    # what the round driver does with results (server/screening.py; None: no screening),
    # and how many plans a round may take when every sampled device fails
    screening: ScreeningConfig | None = field(default_factory=ScreeningConfig)
    round_attempts: int = 3
    # link measurement (server/links.py, docs/links.md): probes per path, the goodput
    # probe's bytes (at most one model), seconds before a probe counts as lost, rounds
    # between refreshes (0: only before round 1) and Shannon's B for the effective SNR
    link_probes: int = 3
    link_probe_bytes: int = 256 * 1024
    link_probe_timeout_s: float = 5.0
    link_probe_parallel: int = 1  # devices probing at once: 1 keeps one device's probes off another's path
    link_measure_max_s: float = 900.0  # a measurement stops asking devices after this long
    links_every: int = 0
    link_bandwidth_hz: float = DEFAULT_BANDWIDTH_HZ
    codec: WireCodec = "fp32"  # how models travel (device/protocol/codecs.py)
    # the site's edges (server/site/edge.py): name -> the devices behind it, whose groups
    # may run there (server/edge/proxy.py); empty: every group runs here
    edges: dict[str, tuple[str, ...]] = field(default_factory=dict)

    # -- what each collaborator takes from these ---------------------------------------
    def bus_settings(self) -> BusSettings:
        return BusSettings(
            self.run,
            self.host,
            self.port,
            self.username,
            self.password,
            self.tls,
            max_queue_bytes=self.max_queue_mb * 2**20,
            max_pending_bytes=self.max_pending_mb * 2**20,
            max_chunk=self.max_chunk,
        )

    def probe_settings(self) -> ProbeSettings:
        return ProbeSettings(
            self.link_probes,
            self.link_probe_bytes,
            self.link_probe_timeout_s,
            self.link_probe_parallel,
            self.link_measure_max_s,
            self.link_bandwidth_hz,
        )

    def execution_settings(self) -> ExecutionSettings:
        return ExecutionSettings(self.run, self.handoff, self.deadline_s, self.max_chunk, self.codec)

    def admission(self) -> Admission:
        rate = self.max_registrations_per_s
        return Admission(
            allowed=self.allowed_devices, max_devices=self.max_devices, rate=rate, burst=max(1.0, 5 * rate)
        )
