"""Screening what devices send, before anything is aggregated: pure functions.

The protocol already refuses a model of the wrong shape or dtype, or one holding NaN
or infinite values (:func:`device.protocol.check_weights`), and the coordinator drops
messages of a stale round or in another device's name. What passes those checks may
still be poisoned: a device that boosts its update by a large factor (Bhagoji et al.,
ICML 2019; Bagdasaryan et al., AISTATS 2020) moves a sample-weighted mean as far as
it likes. The round driver screens every round's results the same way in simulation
and on boards (:mod:`server.defense` holds the state: the norms of past rounds):

* **a reference norm** for each kind of update (parallel members, chains,
  pre-training): the *lower median* of this round's update norms, the accepted norms
  of the last ``history_rounds`` rounds, and the norm of an update the server trained
  itself on its own held-out data when it has some (:mod:`server.reference`; the
  trust bootstrap of FLTrust, Cao et al., NDSS 2021). The median is the robust scale
  estimate: it stays put while fewer than half the entries are poisoned (breakdown
  point 1/2; Huber and Ronchetti, *Robust Statistics*, 2nd ed. 2009, Sec. 1.4); the
  lower one, for an even count, is the smaller middle value, so that of two chains,
  one boosted, the honest one is the reference. History and the server's update give
  a reference when a round has one or two updates of a kind (FedGSP's usual two
  chains on a small site), which the round's median alone cannot.
* **rejection.** An update whose norm exceeds ``norm_factor`` times the reference is
  refused (a parallel member's model, or a chain's). It needs ``min_updates`` entries
  in the reference, or the server's update among them.
* **clipping.** An update between ``clip_factor`` and ``norm_factor`` times the
  reference is scaled down to ``clip_factor`` times it: norm clipping (Sun et al.,
  "Can you really backdoor federated learning?", 2019) with the bound from the
  reference instead of a constant, so it needs no tuning per model and cannot be
  gamed by a device boosting just below the rejection bound (x9 against a bound of
  10 moved FedGSP from 62 % to 40 %).

A chain's norm is compared per member, divided by the square root of the members
that trained: honest hand-offs add up like steps of a random walk (FEMNIST MLP: one
member 0.38, a chain of seven 0.99 ≈ 0.38 √7).

Why these defaults (``norm_factor`` 10, ``clip_factor`` 3): honest updates stay below
both. On FEMNIST writers the largest honest update stays under twice its round's
median; on Synthetic(1,1), whose clients hold 45 to 800 samples and train 20 epochs, it
can pass 3 times (``bench/poisoning.py --survey``; the clean runs' largest ratio is in
docs/results.md, "A real site (issue 7): faults, fuzzing, poisoning"); such an update
is clipped to 3 times, not refused. A relayed chain's hand-offs are clipped tighter, at
2 times (``hop_clip_factor``): a chain passes each member's model on whole, and in a
FEMNIST chain of seven at FedGSP's lr 0.01 a member boosting x9 and clipped to 3 times
cost 14 points where clipped to 2 it cost 1 (honest hand-offs clipped at 2 lost
nothing). docs/results.md ("A dishonest board") gives the accuracy each default costs
on clean runs and saves under attack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from server.aggregation.robust import AGGREGATIONS, AggregationRule
from server.errors import StrategyError
from server.strategies.base import GroupResult, RoundPlan

UpdateKind = Literal["member", "chain", "pretrain", "empty"]
REASON = "screened: update norm"  # the reason in RoundRecord.dropped
EMPTY_REASON = "screened: no samples"


@dataclass(frozen=True)
class ScreeningConfig:
    """How the round driver screens results (see the module docstring).

    Parameters
    ----------
    norm_factor : refuse an update whose norm exceeds this many times the reference
        (``None``: no norm screening, no clipping). Must be above 1.
    clip_factor : scale an update above this many times the reference down to it
        (``None``: no clipping). At least 1, at most ``norm_factor``.
    hop_clip_factor : the same for one member's update inside a relayed chain
        (:mod:`server.hops`); by default tighter than ``clip_factor``, because a chain
        passes each hand-off on whole (any value from 1 to ``norm_factor`` is allowed).
    min_updates : entries the reference needs before the bounds apply (>= 3), unless
        the server's own update is one of them.
    history_rounds : past rounds whose accepted norms join the reference (>= 0).
    weight_cap : a member's averaging weight (its sample count) at most this many times
        the upper quartile of the registered counts (``None``: no cap; :mod:`server.claims`).
    aggregation : ``"mean"`` (FedAvg's sample-weighted mean), ``"median"`` or
        ``"trimmed_mean"`` (Yin et al. 2018).
    trim : the trimmed mean's β, the fraction dropped at each end, in [0, 0.5).
    """

    norm_factor: float | None = 10.0
    clip_factor: float | None = 3.0
    hop_clip_factor: float | None = 2.0
    min_updates: int = 3
    history_rounds: int = 3
    weight_cap: float | None = 2.0
    aggregation: AggregationRule = "mean"
    trim: float = 0.2

    def __post_init__(self) -> None:
        if self.norm_factor is not None and not (_number(self.norm_factor) and 1 < self.norm_factor < float("inf")):
            raise StrategyError(f"the norm factor must be a number above 1, got {self.norm_factor!r}")
        if self.clip_factor is not None:
            limit = self.norm_factor if self.norm_factor is not None else float("inf")
            if not (_number(self.clip_factor) and 1 <= self.clip_factor <= limit):
                raise StrategyError(
                    f"the clip factor must be a number from 1 to the norm factor ({limit}), got {self.clip_factor!r}"
                )
        if self.hop_clip_factor is not None:
            limit = self.norm_factor if self.norm_factor is not None else float("inf")
            if not (_number(self.hop_clip_factor) and 1 <= self.hop_clip_factor <= limit):
                raise StrategyError(
                    f"the hop clip factor must be a number from 1 to the norm factor ({limit}), "
                    f"got {self.hop_clip_factor!r}"
                )
        if isinstance(self.min_updates, bool) or not isinstance(self.min_updates, int) or self.min_updates < 3:
            raise StrategyError(
                f"min_updates must be an integer >= 3 (a median of fewer means little), got {self.min_updates!r}"
            )
        if isinstance(self.history_rounds, bool) or not isinstance(self.history_rounds, int) or self.history_rounds < 0:
            raise StrategyError(f"history_rounds must be an integer >= 0, got {self.history_rounds!r}")
        if self.weight_cap is not None and not (_number(self.weight_cap) and 1 <= self.weight_cap < float("inf")):
            raise StrategyError(f"the weight cap must be a number >= 1, got {self.weight_cap!r}")
        if self.aggregation not in AGGREGATIONS:
            raise StrategyError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}")
        if not (_number(self.trim) and 0 <= self.trim < 0.5):
            raise StrategyError(f"trim must be a fraction in [0, 0.5), got {self.trim!r}")

    @property
    def clip(self) -> float | None:
        """The clipping bound in force (none without a norm bound)."""
        return self.clip_factor if self.norm_factor is not None else None

    @property
    def hop_clip(self) -> float | None:
        """The clipping bound on a relayed hand-off in force (none without a norm bound)."""
        return self.hop_clip_factor if self.norm_factor is not None else None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Rejection:
    """One update refused: whose, of what kind, its norm and the reference it broke."""

    devices: tuple[str, ...]
    kind: UpdateKind
    norm: float
    median: float  # the reference

    def describe(self, factor: float) -> str:
        who = ", ".join(self.devices)
        if self.kind == "empty":
            return f"model of {who}: trained on no samples"
        return f"{self.kind} update of {who}: norm {self.norm:.4g} > {factor:g} x reference {self.median:.4g}"


@dataclass(frozen=True)
class Screened:
    """What screening did to a round: the results to aggregate, the refused updates,
    the clipped ones (devices, kind, the factor their update was scaled by), the
    accepted per-member norms of each kind, each at most the reference (for the
    history), and the largest ratio of an update's norm to its reference (NaN where no
    reference applied)."""

    results: list[GroupResult]
    rejections: list[Rejection]
    clipped: list[tuple[tuple[str, ...], UpdateKind, float]]
    accepted: dict[UpdateKind, list[float]]
    max_ratio: float


def without_empty_members(results: Sequence[GroupResult]) -> tuple[list[GroupResult], list[Rejection]]:
    """A parallel member that returned a model trained on no samples carries no weight
    in any average (and DSC's Eq. 4 cannot weigh it): its model is left out. A device
    registers with at least one sample, so an honest one never sends such a result;
    one that did used to end the run (a zero weight sum)."""
    out, rejections = [], []
    for r in results:
        empty = {m.client_id for m in r.members if m.weights is not None and m.n_samples <= 0}
        if empty:
            rejections += [Rejection((c,), "empty", 0.0, float("nan")) for c in sorted(empty)]
            r = replace(r, members=tuple(replace(m, weights=None) if m.client_id in empty else m for m in r.members))
        out.append(r)
    return out, rejections


NORM_CHUNK = 1 << 15  # values per pass of update_norm: its difference (256 KB) stays in the caches


def update_norm(start: np.ndarray, model: np.ndarray) -> float:
    """``||model - start||_2``, the difference exact and its squares summed in float64.

    The float64 difference is made chunk by chunk into one buffer that stays in the
    caches: a whole one (3.5 MB for the FEMNIST MLP) would go out to memory and back,
    and the norm is bound by memory traffic; the simulator computes one per client.

    The sum of squares is ``einsum``'s own loop, not BLAS's ``dot``: OpenBLAS runs a
    long dot product on threads that then spin for a while, and in the simulator those
    spinning threads took the cores from the interpreter and the worker processes, so
    that a second worker gained nothing.

    Parameters
    ----------
    start, model:
        Flat weight vectors of the same length.

    Returns
    -------
    float
        The Euclidean norm of the update.
    """
    start, model = np.asarray(start).reshape(-1), np.asarray(model).reshape(-1)
    if start.shape != model.shape:
        raise ValueError(f"update_norm: the models have {start.size} and {model.size} values")
    diff = np.empty(min(NORM_CHUNK, start.size), np.float64)
    total = 0.0
    for first in range(0, start.size, NORM_CHUNK):
        part = diff[: min(NORM_CHUNK, start.size - first)]
        np.subtract(model[first : first + part.size], start[first : first + part.size], out=part, dtype=np.float64)
        total += float(np.einsum("i,i->", part, part))
    return float(np.sqrt(total))


def scaled_update(start: np.ndarray, model: np.ndarray, factor: float) -> np.ndarray:
    """``start + factor (model - start)`` in float32: an update scaled down by clipping."""
    start64 = np.asarray(start, np.float64)
    return (start64 + float(factor) * (np.asarray(model, np.float64) - start64)).astype(np.float32)


def lower_median(values: Sequence[float]) -> float:
    """The ⌊(n-1)/2⌋-th smallest of ``values`` (the median for an odd count, the smaller
    middle value for an even one); NaN for none."""
    finite = sorted(v for v in values if np.isfinite(v))
    return finite[(len(finite) - 1) // 2] if finite else float("nan")


def reference_norm(current: Sequence[float], past: Sequence[float], server: float | None, min_updates: int) -> float:
    """The reference of one kind: the lower median of this round's norms, the past
    rounds' accepted norms and the server's own update norm; NaN (no bound) with fewer
    than ``min_updates`` entries unless the server's update is one of them, or when
    the reference is not positive (nothing to scale by)."""
    entries = [*current, *past, *([server] if server is not None and np.isfinite(server) else [])]
    if len(entries) < min_updates and (server is None or not np.isfinite(server)):
        return float("nan")
    ref = lower_median(entries)
    return ref if ref > 0 else float("nan")


def norm_outliers(norms: Sequence[float], factor: float, min_updates: int = 3) -> tuple[np.ndarray, float]:
    """Which of ``norms`` exceed ``factor`` times their median, and the median.

    Nothing is an outlier with fewer than ``min_updates`` norms, or when the median is
    zero (nothing to scale by). (The round's own median only: pre-training, which a
    strategy asks for once, has no history.)"""
    arr = np.asarray(norms, np.float64)
    if len(arr) < min_updates:
        return np.zeros(len(arr), bool), float("nan")
    median = float(np.median(arr))
    if not median > 0:
        return np.zeros(len(arr), bool), median
    return arr > factor * median, median


@dataclass(frozen=True)
class _Update:
    """One screened update: where it is in the results and its per-member norm."""

    index: int  # into the round's results
    devices: tuple[str, ...]
    kind: UpdateKind
    norm: float  # per member: a chain's norm over the square root of its members
    group_mean: bool = False  # an edge's mean of its members' models, screened as one member's
    edge_mean: int | None = None  # which of a split group's edge means (GroupResult.edge_means)


def screen_results(
    plan: RoundPlan,
    results: Sequence[GroupResult],
    config: ScreeningConfig,
    past: Mapping[str, Sequence[float]] | None = None,
    server: float | None = None,
) -> Screened:
    """Refuse and clip the round's updates against each kind's reference.

    Parameters
    ----------
    plan, results : the round as planned and as it came back.
    config : the bounds (a ``norm_factor`` of ``None`` only measures).
    past : accepted per-member norms of earlier rounds, by kind (``"member"``, ``"chain"``).
    server : the norm of one update the server trained on its own data from this
        round's start model (:mod:`server.reference`), or ``None``.

    Returns
    -------
    Screened
        The results with refused models removed (the members stay listed: they
        trained) and clipped models scaled, and what was done.
    """
    out = list(results)
    groups = {g.group_id: g for g in plan.groups}
    updates: list[_Update] = []
    for i, r in enumerate(out):
        g = groups[r.group_id]
        start = plan.models[g.start_model]
        for m in r.members:
            if m.weights is not None:
                norm = m.norm if m.norm is not None else update_norm(start, m.weights)
                updates.append(_Update(i, (m.client_id,), "member", norm))
        if r.group_mean is not None and r.members:
            # held to a member's bound: averaging shrinks honest updates, so a mean above
            # it carries at least one member far above it (the edge lied or let it through)
            norm = update_norm(start, r.group_mean)
            updates.append(_Update(i, tuple(m.client_id for m in r.members), "member", norm, group_mean=True))
        for j, part in enumerate(r.edge_means):
            norm = update_norm(start, part.mean)
            updates.append(_Update(i, part.members, "member", norm, group_mean=True, edge_mean=j))
        if g.mode == "chain" and r.final_weights is not None and r.members:
            per_member = update_norm(start, r.final_weights) / float(np.sqrt(len(r.members)))
            updates.append(_Update(i, tuple(m.client_id for m in r.members), "chain", per_member))
    rejections: list[Rejection] = []
    clipped: list[tuple[tuple[str, ...], UpdateKind, float]] = []
    accepted: dict[UpdateKind, list[float]] = {"member": [], "chain": []}
    ratios: list[float] = []
    for kind in ("member", "chain"):
        mine = [u for u in updates if u.kind == kind]
        ref = reference_norm([u.norm for u in mine], (past or {}).get(kind, ()), server, config.min_updates)
        for u in mine:
            ratio = u.norm / ref if np.isfinite(ref) else float("nan")
            if np.isfinite(ratio):
                ratios.append(ratio)
            if not np.isfinite(u.norm) or (config.norm_factor is not None and ratio > config.norm_factor):
                # a non-finite model is refused with screening off too (the protocol refuses it on receipt)
                rejections.append(Rejection(u.devices, u.kind, u.norm, ref))
                out[u.index] = _drop(out[u.index], u)
            else:
                if config.clip is not None and ratio > config.clip:
                    factor = config.clip / ratio
                    clipped.append((u.devices, u.kind, factor))
                    start = plan.models[groups[out[u.index].group_id].start_model]
                    out[u.index] = _scale(out[u.index], u, start, factor)
                # history keeps at most the reference: an update accepted above it (clipped or
                # not) cannot raise the next round's reference, so a device in every round's
                # only chain cannot ratchet it up by 3x a round; an edge's group mean is no
                # member's update (averaging shrinks it), so it stays out of the history
                if not u.group_mean:
                    accepted[kind].append(min(u.norm, ref) if np.isfinite(ref) else u.norm)
    return Screened(out, rejections, clipped, accepted, max(ratios, default=float("nan")))


def _drop(r: GroupResult, u: _Update) -> GroupResult:
    """``r`` without ``u``'s model (a member's, or the chain's final one)."""
    if u.kind == "chain":
        return replace(r, final_weights=None)
    if u.edge_mean is not None:
        return replace(r, edge_means=tuple(p for j, p in enumerate(r.edge_means) if j != u.edge_mean))
    if u.group_mean:
        return replace(r, group_mean=None)
    kept = tuple(replace(m, weights=None, norm=None) if m.client_id in u.devices else m for m in r.members)
    return replace(r, members=kept)


def _scale(r: GroupResult, u: _Update, start: np.ndarray, factor: float) -> GroupResult:
    """``r`` with ``u``'s update scaled by ``factor`` (its norm with it)."""
    if u.kind == "chain":
        assert r.final_weights is not None
        return replace(r, final_weights=scaled_update(start, r.final_weights, factor))
    if u.edge_mean is not None:
        parts = tuple(
            replace(p, mean=scaled_update(start, p.mean, factor)) if j == u.edge_mean else p
            for j, p in enumerate(r.edge_means)
        )
        return replace(r, edge_means=parts)
    if u.group_mean:
        assert r.group_mean is not None
        return replace(r, group_mean=scaled_update(start, r.group_mean, factor))
    members = tuple(
        replace(m, weights=scaled_update(start, m.weights, factor), norm=u.norm * factor)
        if m.client_id in u.devices and m.weights is not None
        else m
        for m in r.members
    )
    return replace(r, members=members)


def screen_updates(
    updates: Mapping[str, np.ndarray], config: ScreeningConfig
) -> tuple[dict[str, np.ndarray], list[Rejection]]:
    """Pre-training updates (already ``w_after - w_start``) without the outliers, the
    rest clipped to ``clip_factor`` times their median. A strategy asks for them once
    (a cold start), so the reference is the round's own median."""
    kept = dict(updates)
    if config.norm_factor is None:
        return kept, []
    ids = sorted(kept)
    norms = [float(np.linalg.norm(np.asarray(kept[c], np.float64))) for c in ids]
    bad, median = norm_outliers(norms, config.norm_factor, config.min_updates)
    rejections = []
    for c, norm, is_bad in zip(ids, norms, bad, strict=True):
        if is_bad:
            del kept[c]
            rejections.append(Rejection((c,), "pretrain", norm, median))
        elif config.clip is not None and np.isfinite(median) and median > 0 and norm > config.clip * median:
            kept[c] = (np.asarray(kept[c], np.float64) * (config.clip * median / norm)).astype(np.float32)
    return kept, rejections
