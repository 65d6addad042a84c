"""What a field test found: accuracy against wall time, measured links against the topology.

Pure functions over a run's ``results.json`` (:mod:`server.records`) and the field
test's devices (:class:`~server.field.fieldtest.FieldDevice`); :func:`plot_field`
draws them. The topology's values are those of the star covey runs on
(:func:`star_matrices`): a device's own link to the broker, and between two devices
the weaker bandwidth and the two latencies added, since every model passes the broker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from server.links import LinkMatrices
from server.records import json_number, strict_json_values
from server.simulation.topology import LinkProfile, Site, in_turn

ELAPSED_NOTE = "wall seconds of the rounds (after registration and the link measurement before round 1)"


@dataclass(frozen=True)
class SiteRow:
    """One site: its profile and the means of what covey measured for its devices."""

    site: str
    devices: int
    bandwidth_mbps: float
    latency_ms: float
    loss: float
    topology_snr_db: float  # device to server, from the profile (Shannon, capped)
    measured_snr_db: float  # mean measured Γ diagonal
    topology_rtt_ms: float  # to a device of the same site, through the broker
    measured_rtt_ms: float  # mean measured RTT to the site's other devices


@dataclass
class FieldReport:
    """The figures of one field test (``field.json``)."""

    strategy: str
    rounds: int
    accuracy: list[float]  # server-side test accuracy per round
    round_wall_s: list[float]
    final_accuracy: float
    best_accuracy: float
    mean_round_s: float
    target: float | None = None
    rounds_to_target: int | None = None
    time_to_target_s: float | None = None
    sites: list[SiteRow] = field(default_factory=list)
    snr_rank_corr: float = math.nan  # Spearman, measured vs topology Γ (every entry)
    rtt_rank_corr: float = math.nan  # Spearman, measured vs topology RTT (off-diagonal)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    groups: list[list[str]] = field(default_factory=list)  # the last round's
    group_site_ari: float = math.nan
    dsc_primary_site_ari: float = math.nan  # DSC's primary segment on the measured Γ
    rtt_reduction_pct: float = math.nan  # intra-group RTT (topology) below random groups of these sizes
    process_wall_s: float = math.nan
    # bytes per round on the lab's links, by role ("devices", "coordinator", "broker") and
    # direction ("down": to the host, "up": from it); round 1 from the coordinator's start
    link_bytes: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    # with [[edge]] sites: "edge" (the gateways ran the rooms' brokers and groups) or
    # "central" (they forwarded), and the groups the edges ran
    edges: str | None = None
    groups_at_edges: int = 0

    def link_mb_per_round(self, role: str) -> float:
        """Mean MB per round on ``role``'s links, both ways (NaN when not measured)."""
        rounds = self.link_bytes.get(role)
        if not rounds or not rounds["down"]:
            return math.nan
        return (sum(rounds["down"]) + sum(rounds["up"])) / len(rounds["down"]) / 1e6

    def to_dict(self) -> dict[str, Any]:
        """The report as strict JSON values: NaN (not measured) as ``None``."""
        out: dict[str, Any] = strict_json_values(asdict(self))
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FieldReport:
        """Read back :meth:`to_dict` (a ``field.json``)."""
        optional = {"target", "rounds_to_target", "time_to_target_s"}
        values: dict[str, Any] = {k: (math.nan if v is None and k not in optional else v) for k, v in raw.items()}
        values["accuracy"] = [math.nan if a is None else a for a in raw["accuracy"]]
        rows: list[dict[str, Any]] = [{k: math.nan if v is None else v for k, v in s.items()} for s in raw["sites"]]
        values["sites"] = [SiteRow(**row) for row in rows]
        return cls(**values)


def star_matrices(
    ids: Sequence[str], site_of: Mapping[str, Site], bandwidth_hz: float, *, via_edges: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Γ (dB; diagonal: to the server) and RTT (ms) of the topology as covey's star sees it:
    two devices reach each other through the broker they share, which is their site's
    edge when ``via_edges`` and the site has one, else the central broker."""
    n = len(ids)
    snr, rtt = np.zeros((n, n)), np.zeros((n, n))
    for i, a in enumerate(ids):
        sa = site_of[a]
        snr[i, i] = sa.server_link.snr(bandwidth_hz)
        for j, b in enumerate(ids):
            if i != j:
                via = star_pair(sa, site_of[b], via_edges=via_edges)
                snr[i, j] = via.snr(bandwidth_hz)
                rtt[i, j] = 2 * via.latency_ms
    return snr, rtt


def star_pair(a: Site, b: Site, *, via_edges: bool) -> LinkProfile:
    """The path between a device of ``a`` and one of ``b`` through their shared broker."""
    if via_edges and a.name == b.name and a.uplink is not None:
        return replace(in_turn(a.link, b.link), jitter_ms=0.0)
    return replace(in_turn(a.server_link, b.server_link), jitter_ms=0.0)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation of two equally long vectors (NaN when either is constant)."""
    from scipy.stats import spearmanr

    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    return float(spearmanr(a, b).statistic)


def rtt_reduction_pct(rtt: np.ndarray, labels: np.ndarray) -> float:
    """How much lower the summed intra-group RTT of ``labels`` is than that of random
    groups of the same sizes (its exact expectation: every pair of a group is a random
    pair of distinct devices), in percent.

    Parameters
    ----------
    rtt : (n, n) RTT matrix (ms), symmetrised here.
    labels : (n,) group of each device.

    Returns
    -------
    ``100 · (1 − grouped / random)``; 0 when every device is alone.
    """
    sym = (rtt + rtt.T) / 2
    n = len(labels)
    grouped, pairs = 0.0, 0
    for g in np.unique(labels):
        members = np.flatnonzero(labels == g)
        grouped += float(sym[np.ix_(members, members)].sum()) / 2
        pairs += len(members) * (len(members) - 1) // 2
    if pairs == 0:
        return 0.0
    mean_pair = float(sym[~np.eye(n, dtype=bool)].mean())
    return 100.0 * (1.0 - grouped / (pairs * mean_pair)) if mean_pair > 0 else 0.0


def time_to_target(
    accuracy: Sequence[float], wall_s: Sequence[float], target: float
) -> tuple[int | None, float | None]:
    """The first round whose accuracy reaches ``target`` and the wall seconds of the
    rounds up to it (``None`` if never)."""
    elapsed = 0.0
    for k, (acc, w) in enumerate(zip(accuracy, wall_s, strict=True), start=1):
        elapsed += w
        if math.isfinite(acc) and acc >= target:
            return k, elapsed
    return None, None


def build_report(
    doc: Mapping[str, Any],
    site_of: Mapping[str, Site],
    *,
    strategy: str,
    bandwidth_hz: float,
    class_counts: Mapping[str, np.ndarray] | None = None,
    target: float | None = None,
    link_bytes: Mapping[str, Mapping[str, Sequence[int]]] | None = None,
    via_edges: bool = False,
) -> FieldReport:
    """The report of one run's ``results.json`` (``doc``) on the topology's sites.

    Parameters
    ----------
    doc : the parsed ``results.json``.
    site_of : each device id's site.
    strategy : the strategy's name, for the report.
    bandwidth_hz : Shannon's ``B`` for the topology's SNRs (the run's must match).
    class_counts : per device, for DSC's primary segment on the measured Γ (optional).
    target : accuracy to time (fraction), optional.
    link_bytes : what the links carried per round
        (:meth:`~server.field.fieldtest.LinkTraffic.as_dict`), optional.
    via_edges : the sites' edges ran (``[[edge]]``): a site's devices reach each other
        through it (:func:`star_matrices`).
    """
    from sklearn.metrics import adjusted_rand_score

    rounds = doc.get("rounds", [])
    acc = [json_number(r.get("server_accuracy")) for r in rounds]
    wall = [float(r.get("wall_s", 0.0)) for r in rounds]
    finite = [a for a in acc if math.isfinite(a)]
    report = FieldReport(
        strategy=strategy,
        rounds=len(rounds),
        accuracy=acc,
        round_wall_s=wall,
        final_accuracy=finite[-1] if finite else math.nan,
        best_accuracy=max(finite) if finite else math.nan,
        mean_round_s=float(np.mean(wall)) if wall else math.nan,
        target=target,
    )
    per_link = {role: {way: list(v) for way, v in ways.items()} for role, ways in (link_bytes or {}).items()}
    if per_link and all(len(v) == len(rounds) for ways in per_link.values() for v in ways.values()):
        report.link_bytes = per_link  # one entry per round on record, or none
    if target is not None:
        report.rounds_to_target, report.time_to_target_s = time_to_target(acc, wall, target)
    ids = sorted(site_of)
    sites = np.array([site_of[d].name for d in ids])
    top_snr, top_rtt = star_matrices(ids, site_of, bandwidth_hz, via_edges=via_edges)
    if rounds and rounds[-1].get("groups"):
        report.groups = [list(g) for g in rounds[-1]["groups"]]
        where = {d: k for k, g in enumerate(report.groups) for d in g}
        if set(where) == set(ids):
            labels = np.array([where[d] for d in ids])
            report.group_site_ari = float(adjusted_rand_score(sites, labels))
            report.rtt_reduction_pct = rtt_reduction_pct(top_rtt, labels)
    raw = doc.get("links")
    if raw is None:
        return report
    measured = LinkMatrices.from_dict(raw)
    if list(measured.ids) != ids:
        return report  # not this test's devices: nothing to compare
    report.sources = {"snr": measured.counts("snr"), "rtt": measured.counts("rtt")}
    off = ~np.eye(len(ids), dtype=bool)
    if measured.snr_db is not None:
        report.snr_rank_corr = spearman(measured.snr_db.ravel(), top_snr.ravel())
        if class_counts is not None:
            from server.grouping.dsc import dsc_groups

            counts = np.stack([class_counts[d] for d in ids])
            # on what DSC groups on: the probe measurement before the rounds (a single
            # transfer timing can be off, and it is no input of DSC's grouping)
            grouped = LinkMatrices.from_dict(raw["probed"]) if raw.get("probed") else measured
            snr = grouped.snr_db if grouped.snr_db is not None else measured.snr_db
            primary, _ = dsc_groups((snr + snr.T) / 2, counts, random_state=0)
            report.dsc_primary_site_ari = float(adjusted_rand_score(sites, primary))
    if measured.rtt_ms is not None:
        report.rtt_rank_corr = spearman(measured.rtt_ms[off], top_rtt[off])
    for name in dict.fromkeys(site_of[d].name for d in ids):
        members = np.flatnonzero(sites == name)
        site = site_of[ids[members[0]]]
        up = site.server_link  # through the site's uplink too, where it has an edge
        same = np.zeros_like(off)
        same[np.ix_(members, members)] = True
        same &= off
        report.sites.append(
            SiteRow(
                name,
                len(members),
                up.bandwidth_mbps,
                up.latency_ms,
                up.loss,
                up.snr(bandwidth_hz),
                _mean(None if measured.snr_db is None else measured.snr_db[members, members]),
                2 * star_pair(site, site, via_edges=via_edges).latency_ms,
                _mean(None if measured.rtt_ms is None else measured.rtt_ms[same]),
            )
        )
    return report


def _mean(values: np.ndarray | None) -> float:
    return float(np.mean(values)) if values is not None and len(values) else math.nan


def format_report(report: FieldReport, results_dir: Path) -> str:
    """The closing summary a user reads."""
    pct = lambda v: "n/a" if not math.isfinite(v) else f"{100 * v:.1f} %"  # noqa: E731
    lines = [
        f"field test of {report.strategy}: {report.rounds} rounds, accuracy {pct(report.final_accuracy)} "
        f"(best {pct(report.best_accuracy)}), {report.mean_round_s:.1f} s per round",
    ]
    if report.target is not None:
        reached = (
            f"in {report.time_to_target_s:.0f} s (round {report.rounds_to_target})"
            if report.time_to_target_s is not None
            else "not reached"
        )
        lines.append(f"target {pct(report.target)}: {reached} ({ELAPSED_NOTE})")
    if report.link_bytes:
        mb = {role: report.link_mb_per_round(role) for role in ("devices", "coordinator", "broker")}
        lines.append(
            f"on the links per round, both ways: devices {mb['devices']:.1f} MB (all together), coordinator "
            f"{mb['coordinator']:.1f} MB, broker {mb['broker']:.1f} MB (round 1 from the coordinator's start)"
        )
        if "uplinks" in report.link_bytes:
            lines.append(f"on the sites' uplinks per round, both ways: {report.link_mb_per_round('uplinks'):.1f} MB")
    if report.edges == "edge":
        lines.append(f"the sites' edges ran {report.groups_at_edges} groups (logs/edge-*.log)")
    elif report.edges == "central":
        lines.append("the sites' gateways only forwarded (--central): every group ran at the coordinator")
    if report.sites:
        lines.append("site          devices  Mbit/s  lat ms   Γ topology  Γ measured  RTT topology  RTT measured")
        for s in report.sites:
            lines.append(
                f"{s.site[:12]:<12} {s.devices:>8} {s.bandwidth_mbps:>7g} {s.latency_ms:>7g} "
                f"{s.topology_snr_db:>9.1f} dB {s.measured_snr_db:>8.1f} dB {s.topology_rtt_ms:>10.0f} ms "
                f"{s.measured_rtt_ms:>10.0f} ms"
            )
        lines.append(
            f"rank agreement with the topology: Γ {report.snr_rank_corr:.2f}, RTT {report.rtt_rank_corr:.2f} "
            f"(Spearman); entries by source: SNR {report.sources.get('snr')}, RTT {report.sources.get('rtt')}"
        )
    if report.groups:
        cut = report.rtt_reduction_pct
        versus = "n/a" if not math.isfinite(cut) else f"{abs(cut):.0f} % {'below' if cut >= 0 else 'above'}"
        lines.append(
            f"last round's groups: {len(report.groups)}, site ARI {report.group_site_ari:.2f}, intra-group RTT "
            f"{versus} random groups of these sizes"
        )
    if math.isfinite(report.dsc_primary_site_ari):
        lines.append(f"DSC's primary segment on the measured Γ: site ARI {report.dsc_primary_site_ari:.2f}")
    lines.append(f"report {results_dir / 'field.json'}, plot {results_dir / 'field.png'}, run {results_dir / 'state'}")
    return "\n".join(lines)


def plot_field(runs: Mapping[str, FieldReport], path: Path, *, title: str = "", target: float | None = None) -> None:
    """Accuracy against the rounds' cumulative wall time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, r in runs.items():
        ax.plot(np.cumsum(r.round_wall_s), 100 * np.asarray(r.accuracy), marker=".", label=label)
    if target is not None:
        ax.axhline(100 * target, color="grey", ls=":", lw=1, label=f"target {100 * target:.0f} %")
    ax.set_xlabel("wall time of the rounds (s)")
    ax.set_ylabel("server-side test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
