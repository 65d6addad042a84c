"""Network topologies for simulation (``covey simulate --topology FILE``).

A topology is a TOML file of sites, each with a number of devices and the profile of
their link to the server, and optional per-pair links between sites (device to device,
as DSC's D2D links or two boards on one access point)::

    bandwidth_mhz = 20            # Shannon's B for SNRs derived from bandwidth

    [[site]]
    name = "near"
    devices = 4
    bandwidth_mbps = 50           # each device's link to the server, both ways
    latency_ms = 2                # one way
    loss = 0.0                    # fraction of packets lost (goodput scales by 1 - loss)
    # jitter_ms = 0               # uniform extra one-way delay, 0..jitter_ms (field tests)
    # snr_db = 25                 # optional; else the SNR that carries the bandwidth

    [[link]]                      # optional: devices of these sites talk directly
    sites = ["near", "near"]
    bandwidth_mbps = 100
    latency_ms = 1

    [[edge]]                      # optional: the site has its own broker on a gateway
    site = "near"                 # (``covey edge run``); its devices' link above is to it,
    bandwidth_mbps = 4            # and this is the gateway's uplink to the server, shared
    latency_ms = 50               # by the whole site (loss and jitter_ms too)

Devices are the simulation's clients in sorted order: the first site takes the first
``devices`` clients, and so on; the sites must hold exactly as many devices as there
are clients. Without a ``[[link]]`` for a pair of sites, their devices talk through the
server: the weaker bandwidth of the two links, the latencies added. A site with an
``[[edge]]`` reaches the server over its device link and then the uplink (the weaker
bandwidth, the latencies added; the uplink's sharing is not modelled here); two of its
devices reach each other through the edge, over their device links only.

:func:`link_matrices` gives the strategies Γ and the RTT matrix (the same
:class:`server.links.LinkMatrices` a run on boards measures), and
:class:`TopologyCostModel` the time of a round on these links (FedGSP Eq. 15-17 with
per-device rates: a chain hands its model on in turn, parallel members work at once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import ConfigError
from device.link import shannon_snr_db
from server.costs import CostModel
from server.links import LinkMatrices
from server.strategies.base import Aggregation, GroupResult, MemberResult, RoundPlan, TrainConfig

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


@dataclass(frozen=True)
class LinkProfile:
    """One link: goodput ``bandwidth_mbps`` (Mbit/s), one-way ``latency_ms``, ``loss``
    fraction, optionally a stated ``snr_db``, and ``jitter_ms`` (a uniform extra one-way
    delay; only a field test's relay applies it: the time model and the matrices ignore it)."""

    bandwidth_mbps: float
    latency_ms: float = 0.0
    loss: float = 0.0
    snr_db: float | None = None
    jitter_ms: float = 0.0

    @property
    def goodput_bps(self) -> float:
        return self.bandwidth_mbps * 1e6 * (1.0 - self.loss)

    def transfer_s(self, n_bytes: float) -> float:
        """Seconds to move ``n_bytes`` (latency once, then the bytes at the goodput)."""
        return self.latency_ms / 1000.0 + 8.0 * n_bytes / self.goodput_bps

    def snr(self, bandwidth_hz: float) -> float:
        """The stated SNR, else the one at which ``bandwidth_hz`` carries the goodput
        (:func:`device.link.shannon_snr_db`, capped like a measured one)."""
        if self.snr_db is not None:
            return self.snr_db
        return shannon_snr_db(self.goodput_bps, bandwidth_hz)


@dataclass(frozen=True)
class Site:
    """A site's devices and their link: to the server, or to the site's edge when it has
    an ``uplink`` (the edge's link to the server, :attr:`server_link` the two in turn)."""

    name: str
    devices: int
    link: LinkProfile
    uplink: LinkProfile | None = None

    @property
    def server_link(self) -> LinkProfile:
        """A device's path to the server: its link, then the site's uplink if any."""
        if self.uplink is None:
            return self.link
        return in_turn(self.link, self.uplink)


def in_turn(a: LinkProfile, b: LinkProfile) -> LinkProfile:
    """Two links one after the other: the lower goodput, the latencies and jitters
    added, the SNR of the weaker when both state one."""
    return LinkProfile(
        min(a.goodput_bps, b.goodput_bps) / 1e6,
        a.latency_ms + b.latency_ms,
        0.0,
        None if a.snr_db is None or b.snr_db is None else min(a.snr_db, b.snr_db),
        a.jitter_ms + b.jitter_ms,
    )


@dataclass(frozen=True)
class Topology:
    sites: tuple[Site, ...]
    pair_links: Mapping[frozenset[str], LinkProfile] = field(default_factory=dict)
    bandwidth_hz: float = 20e6
    source: str = "topology"

    @property
    def n_devices(self) -> int:
        return sum(s.devices for s in self.sites)

    def site_of(self, ids: Sequence[str]) -> dict[str, Site]:
        """Clients (sorted) to sites, in the file's order."""
        ordered = sorted(ids)
        if len(ordered) != self.n_devices:
            raise ConfigError(
                f"{self.source} places {self.n_devices} devices but the simulation has {len(ordered)} clients: "
                "make the sites' devices add up to the number of clients"
            )
        out: dict[str, Site] = {}
        it = iter(ordered)
        for site in self.sites:
            for _ in range(site.devices):
                out[next(it)] = site
        return out

    def pair(self, a: Site, b: Site) -> LinkProfile:
        """The link between a device of ``a`` and one of ``b``: a ``[[link]]`` between
        the sites, else through the site's edge (same site, with an uplink), else
        through the server."""
        direct = self.pair_links.get(frozenset((a.name, b.name)))
        if direct is not None:
            return direct
        if a.name == b.name and a.uplink is not None:
            return replace(in_turn(a.link, b.link), jitter_ms=0.0)
        return replace(in_turn(a.server_link, b.server_link), jitter_ms=0.0)

    @property
    def edge_sites(self) -> tuple[Site, ...]:
        """The sites with an ``[[edge]]``, in the file's order."""
        return tuple(s for s in self.sites if s.uplink is not None)


def _number(raw: Mapping[str, Any], key: str, where: str, low: float, high: float, default: float | None) -> float:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: {key} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"{where}: {key} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _profile(raw: Mapping[str, Any], where: str) -> LinkProfile:
    known = {"name", "devices", "sites", "bandwidth_mbps", "latency_ms", "loss", "snr_db", "jitter_ms"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (known: bandwidth_mbps, latency_ms, jitter_ms, loss, snr_db)"
        )
    snr = raw.get("snr_db")
    return LinkProfile(
        _number(raw, "bandwidth_mbps", where, 1e-3, 1e6, None),
        _number(raw, "latency_ms", where, 0, 60_000, 0.0),
        _number(raw, "loss", where, 0, 0.99, 0.0),
        None if snr is None else _number(raw, "snr_db", where, -200, 100, None),
        _number(raw, "jitter_ms", where, 0, 60_000, 0.0),
    )


def parse_topology(raw: Mapping[str, Any], source: str = "topology") -> Topology:
    """Check a parsed topology; every mistake is one :class:`ConfigError` naming the place."""
    unknown = sorted(set(raw) - {"bandwidth_mhz", "site", "link", "edge"})
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (known: bandwidth_mhz, [[site]], [[link]], [[edge]])")
    sites_raw = raw.get("site")
    if not isinstance(sites_raw, list) or not sites_raw or not all(isinstance(s, dict) for s in sites_raw):
        raise ConfigError(f"{source}: needs at least one [[site]] table")
    sites = []
    for i, s in enumerate(sites_raw):
        name = s.get("name")
        where = f"{source} site {i + 1}"
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: name must be a non-empty string")
        devices = s.get("devices")
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ConfigError(f"{where} ({name}): devices must be a whole number >= 1, got {devices!r}")
        sites.append(Site(name, devices, _profile(s, f"{where} ({name})")))
    names = [s.name for s in sites]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: site names must differ ({', '.join(names)})")
    pairs: dict[frozenset[str], LinkProfile] = {}
    links_raw = raw.get("link", [])
    if not isinstance(links_raw, list) or not all(isinstance(x, dict) for x in links_raw):
        raise ConfigError(f"{source}: link must be [[link]] tables")
    for i, link in enumerate(links_raw):
        where = f"{source} link {i + 1}"
        ends = link.get("sites")
        if not isinstance(ends, list) or len(ends) != 2 or any(e not in names for e in ends):
            raise ConfigError(f"{where}: sites must name two sites of the file ({', '.join(names)}), got {ends!r}")
        key = frozenset(ends)
        if key in pairs:
            raise ConfigError(f"{where}: the link between {ends[0]} and {ends[1]} is given twice")
        pairs[key] = _profile(link, where)
    sites = _with_edges(sites, raw.get("edge", []), source)
    bandwidth = _number(raw, "bandwidth_mhz", source, 1e-3, 1e5, 20.0) * 1e6
    return Topology(tuple(sites), pairs, bandwidth, source)


def _with_edges(sites: list[Site], edges_raw: object, source: str) -> list[Site]:
    """``sites`` with the uplinks of their ``[[edge]]`` tables (at most one per site)."""
    if not isinstance(edges_raw, list) or not all(isinstance(x, dict) for x in edges_raw):
        raise ConfigError(f"{source}: edge must be [[edge]] tables")
    uplinks: dict[str, LinkProfile] = {}
    names = [s.name for s in sites]
    for i, edge in enumerate(edges_raw):
        where = f"{source} edge {i + 1}"
        site = edge.get("site")
        if site not in names:
            raise ConfigError(f"{where}: site must name a site of the file ({', '.join(names)}), got {site!r}")
        if site in uplinks:
            raise ConfigError(f"{where}: site {site!r} has an edge already; a site has one")
        uplinks[site] = _profile({k: v for k, v in edge.items() if k != "site"}, f"{where} ({site})")
    return [replace(s, uplink=uplinks.get(s.name)) for s in sites]


def load_topology(path: Path | str) -> Topology:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--topology {path}: cannot read it ({exc.strerror or exc})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--topology {path} is not valid TOML ({exc})") from exc
    return parse_topology(raw, str(path))


def link_matrices(topology: Topology, ids: Sequence[str]) -> LinkMatrices:
    """Γ (dB; diagonal: device to server) and RTT (ms) over the sorted ``ids``, every
    entry from the topology (source ``topology``)."""
    ordered = sorted(ids)
    site = topology.site_of(ordered)
    n = len(ordered)
    snr, rtt = np.zeros((n, n)), np.zeros((n, n))
    for i, a in enumerate(ordered):
        snr[i, i] = site[a].server_link.snr(topology.bandwidth_hz)
        for j, b in enumerate(ordered):
            if i != j:
                link = topology.pair(site[a], site[b])
                snr[i, j] = link.snr(topology.bandwidth_hz)
                rtt[i, j] = 2 * link.latency_ms
    src = np.full((n, n), "topology", dtype=object)
    rtt_src = src.copy()
    np.fill_diagonal(rtt_src, "self")
    return LinkMatrices(tuple(ordered), topology.bandwidth_hz, snr, src, rtt, rtt_src)


@dataclass(frozen=True)
class TopologyCostModel(CostModel):
    """FedGSP Eq. 15-17 on a topology's links: the time of a round is that of its slowest
    group (``t_round_s``).

    A chain's first member downloads over its server link, each member trains and hands
    on over the pair link, and the last returns the model over its server link. A
    parallel group, by the round's :data:`~server.strategies.base.Aggregation`:

    * ``server``: each member downloads, trains and uploads over its own server link;
    * ``leader`` (DSC, Sun et al. Eq. 2-3; FedAvg-IC's global rounds): the group's leader
      gets the model over its server link and passes it to each member over their pair
      link, members train and return it the same way, and the leader uploads the group's
      aggregate;
    * ``leader_only`` (FedAvg-IC's group rounds, Lee et al. ``d_group``): as ``leader``
      without the server link: the group model stays with the leader.

    The leader is the member that reaches the others soonest (least summed transfer
    time over the pair links: the medoid of the communication cost alone; FedAvg-IC's
    Eq. 11 adds the IID cost, DSC's leader is its affinity-propagation exemplar). Its
    transfers to the members are counted as running side by side; sharing the leader's
    own link they would take up to k − 1 times as long, so this flatters leader-based
    aggregation on large groups. HierFAVG, FedAvg-IC's schedule, is timed the same way
    (its paper aggregates at edge servers).

    Training takes ``flops_per_param`` FLOPs per parameter and sample (2 forward, 4
    backward: the usual estimate for dense layers) at ``device_flops``, over the samples a
    member actually trains: its data times the epochs, or ``max_steps`` mini-batches when
    the plan caps them (FedAvg-IC's τ1 steps). ``flops_per_param=None`` keeps FedGSP's
    96 MFLOPs per sample, which is its CNN's and far more than an MLP's.
    """

    topology: Topology | None = None
    site: dict[str, Site] = field(default_factory=dict)
    flops_per_param: float | None = 6.0

    def _train_s(self, n_samples: int, train: TrainConfig, model_bytes: int) -> float:
        samples = n_samples * train.epochs
        if train.max_steps is not None:
            samples = min(samples, train.max_steps * train.batch_size)
        per_sample = self.flops_per_sample if self.flops_per_param is None else self.flops_per_param * model_bytes / 4
        return per_sample / self.device_flops * samples

    def _pair_s(self, a: str, b: str, model_bytes: int) -> float:
        assert self.topology is not None
        return 0.0 if a == b else self.topology.pair(self.site[a], self.site[b]).transfer_s(model_bytes)

    def _chain_s(self, members: Sequence[MemberResult], train: TrainConfig, model_bytes: int) -> float:
        first, last = self.site[members[0].client_id], self.site[members[-1].client_id]
        t = first.server_link.transfer_s(model_bytes) + last.server_link.transfer_s(model_bytes)
        for k, m in enumerate(members):
            t += self._train_s(m.n_samples, train, model_bytes)
            if k + 1 < len(members):
                t += self._pair_s(m.client_id, members[k + 1].client_id, model_bytes)
        return t

    def _parallel_s(
        self, members: Sequence[MemberResult], train: TrainConfig, model_bytes: int, aggregation: Aggregation
    ) -> float:
        if aggregation == "server":
            return max(
                2 * self.site[m.client_id].server_link.transfer_s(model_bytes)
                + self._train_s(m.n_samples, train, model_bytes)
                for m in members
            )
        ids = [m.client_id for m in members]
        leader = min(ids, key=lambda a: sum(self._pair_s(a, b, model_bytes) for b in ids))
        t = max(
            2 * self._pair_s(leader, m.client_id, model_bytes) + self._train_s(m.n_samples, train, model_bytes)
            for m in members
        )
        if aggregation == "leader":
            t += 2 * self.site[leader].server_link.transfer_s(model_bytes)
        return t

    def round_costs(
        self,
        plan: RoundPlan,
        results: Sequence[GroupResult],
        epochs: int,
        model_bytes: int,
        aggregation: Aggregation = "server",
    ) -> dict[str, float]:
        costs = super().round_costs(plan, results, epochs, model_bytes, aggregation)
        if self.topology is None:
            return costs
        slowest = 0.0
        for g, r in zip(plan.groups, results, strict=True):
            members = [m for m in r.members if m.client_id in self.site]
            if not members:
                continue
            if g.mode == "chain":
                t = self._chain_s(members, plan.train, model_bytes)
            else:
                t = self._parallel_s(members, plan.train, model_bytes, aggregation)
            slowest = max(slowest, t)
        costs["t_round_s"] = slowest
        return costs
