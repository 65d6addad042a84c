"""Screening what devices send, before anything is aggregated.

The protocol already refuses a model of the wrong shape or dtype, or one holding NaN
or infinite values (:func:`device.protocol.check_weights`), and the coordinator drops
messages of a stale round or in another device's name. What passes those checks may
still be poisoned: a device that boosts its update by a large factor (Bhagoji et al.,
ICML 2019; Bagdasaryan et al., AISTATS 2020) moves a sample-weighted mean as far as
it likes. The round driver (:mod:`server.rounds`) therefore screens every round's
results the same way in simulation and on boards:

* **update-norm bound.** A parallel member's update is ``w_k - w_start`` (its group's
  start model); a chain's is ``w_final - w_start``. An update whose L2 norm exceeds
  ``norm_factor`` times the median norm of the round's updates of the same kind
  (members, or chains) is rejected. The median is the robust scale estimate: it stays
  put while fewer than half the updates are poisoned (breakdown point 1/2; Huber and
  Ronchetti, *Robust Statistics*, 2nd ed. 2009, Sec. 1.4). A bound relative to the
  norm, as in norm-clipping defences (Sun et al., "Can you really backdoor federated
  learning?", 2019), but scaled by the round's own median instead of a fixed
  threshold, so it needs no tuning per model. It only applies with at least
  ``min_updates`` updates of a kind in the round. Pre-training updates (FedGroup and
  FlexCFL's cold start) are screened alike.
* **robust aggregation.** ``aggregation`` picks what FedAvg-style strategies average
  with: the sample-weighted mean, or the coordinate-wise median or trimmed mean of Yin
  et al. (ICML 2018) (:mod:`server.aggregation.robust`).

A rejected parallel member's model, or a rejected chain's, is left out of the
aggregate (the members stay listed: they trained). Each rejection is
logged, counted per device in :attr:`server.rounds.RoundRecord.rejected` and by
reason in ``dropped``.

Why on by default, with ``norm_factor = 10``: honest updates stay far below it. On
FEMNIST writers (FedAvg, FedProx, FedGSP, IFCA; ``bench/poisoning.py``) the largest
update was 1.33 times its round's median; on Synthetic(1,1), whose clients hold 45 to
800 samples and train 20 epochs, 3.6 times (``bench/poisoning.py --survey``). No
honest update was refused in any of these runs, the check costs one pass over the
updates, and a x100 poisoner sits at 80-100 times the median. Robust aggregation
stays off by default (``"mean"``): the median and the trimmed mean cost accuracy on
non-IID data even without an attacker, and a trimmed mean over fewer than
``1 / trim`` updates trims nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from server.aggregation.robust import AGGREGATIONS, AggregationRule
from server.errors import StrategyError
from server.strategies.base import GroupResult, RoundPlan

log = logging.getLogger("covey.server")
UpdateKind = Literal["member", "chain", "pretrain", "empty"]
REASON = "screened: update norm"  # the reason in RoundRecord.dropped
EMPTY_REASON = "screened: no samples"


@dataclass(frozen=True)
class ScreeningConfig:
    """How the round driver screens results (see the module docstring).

    Parameters
    ----------
    norm_factor : reject an update whose norm exceeds this many times the round's
        median (``None``: no norm bound). Must be above 1.
    min_updates : updates of a kind a round needs before the bound applies (>= 3).
    aggregation : ``"mean"`` (FedAvg's sample-weighted mean), ``"median"`` or
        ``"trimmed_mean"`` (Yin et al. 2018).
    trim : the trimmed mean's β, the fraction dropped at each end, in [0, 0.5).
    """

    norm_factor: float | None = 10.0
    min_updates: int = 3
    aggregation: AggregationRule = "mean"
    trim: float = 0.2

    def __post_init__(self) -> None:
        if self.norm_factor is not None and not (
            isinstance(self.norm_factor, (int, float)) and 1 < self.norm_factor < float("inf")
        ):
            raise StrategyError(f"the norm factor must be a number above 1, got {self.norm_factor!r}")
        if isinstance(self.min_updates, bool) or not isinstance(self.min_updates, int) or self.min_updates < 3:
            raise StrategyError(
                f"min_updates must be an integer >= 3 (a median of fewer means little), got {self.min_updates!r}"
            )
        if self.aggregation not in AGGREGATIONS:
            raise StrategyError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}")
        if not (isinstance(self.trim, (int, float)) and 0 <= self.trim < 0.5):
            raise StrategyError(f"trim must be a fraction in [0, 0.5), got {self.trim!r}")


@dataclass(frozen=True)
class Rejection:
    """One update refused: whose, of what kind, its norm and the round's median."""

    devices: tuple[str, ...]
    kind: UpdateKind
    norm: float
    median: float

    def describe(self, factor: float) -> str:
        who = ", ".join(self.devices)
        if self.kind == "empty":
            return f"model of {who}: trained on no samples"
        return f"{self.kind} update of {who}: norm {self.norm:.4g} > {factor:g} x median {self.median:.4g}"


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
            r = GroupResult(
                r.group_id,
                tuple(replace(m, weights=None) if m.client_id in empty else m for m in r.members),
                r.final_weights,
                r.skipped,
            )
        out.append(r)
    return out, rejections


NORM_CHUNK = 1 << 15  # values per pass of update_norm: its difference (256 KB) stays in the caches


def update_norm(start: np.ndarray, model: np.ndarray) -> float:
    """``||model - start||_2``, the difference exact and its squares summed in float64.

    The float64 difference is made chunk by chunk into one buffer that stays in the
    caches: a whole one (3.5 MB for the FEMNIST MLP) went out to memory and back and
    took 1.4 ms per update, about a sixth of a simulated client's training
    (docs/results.md, "Simulation speed, fourth pass"); chunked, 0.6 ms.

    The sum of squares is ``einsum``'s own loop, not BLAS's ``dot``: OpenBLAS runs a
    long dot product on threads that then spin for a while, and in the simulator those
    spinning threads took the cores from the interpreter and the worker processes
    (a FedAvg round on two workers was no faster than on one; docs/results.md,
    "Simulation speed, third pass").

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


def norm_outliers(norms: Sequence[float], factor: float, min_updates: int = 3) -> tuple[np.ndarray, float]:
    """Which of ``norms`` exceed ``factor`` times their median, and the median.

    Nothing is an outlier with fewer than ``min_updates`` norms, or when the median is
    zero (nothing to scale by)."""
    arr = np.asarray(norms, np.float64)
    if len(arr) < min_updates:
        return np.zeros(len(arr), bool), float("nan")
    median = float(np.median(arr))
    if not median > 0:
        return np.zeros(len(arr), bool), median
    return arr > factor * median, median


def screen_results(
    plan: RoundPlan, results: Sequence[GroupResult], config: ScreeningConfig
) -> tuple[list[GroupResult], list[Rejection], float]:
    """The round's results without the updates that fail the norm bound, those refused,
    and the largest ratio of an update's norm to its kind's median (NaN when the bound
    did not apply): how close the round came to the bound."""
    out = list(results)
    if config.norm_factor is None:
        return out, [], float("nan")
    groups = {g.group_id: g for g in plan.groups}
    rejections: list[Rejection] = []
    # parallel members: every member's update against its group's start model (computed
    # already where the server received it, MemberResult.norm, or here)
    members: list[tuple[int, str, float]] = []
    for i, r in enumerate(out):
        start = plan.models[groups[r.group_id].start_model]
        for m in r.members:
            if m.weights is not None:
                members.append((i, m.client_id, m.norm if m.norm is not None else update_norm(start, m.weights)))
    bad, median = norm_outliers([n for _, _, n in members], config.norm_factor, config.min_updates)
    ratios = [n / median for _, _, n in members] if median > 0 else []
    refused: dict[int, set[str]] = {}
    for (i, client, norm), is_bad in zip(members, bad, strict=True):
        if is_bad:
            refused.setdefault(i, set()).add(client)
            rejections.append(Rejection((client,), "member", norm, median))
    for i, clients in refused.items():  # the member stays listed, without its model
        r = out[i]
        kept = tuple(replace(m, weights=None) if m.client_id in clients else m for m in r.members)
        out[i] = GroupResult(r.group_id, kept, r.final_weights, r.skipped)
    # chains: each chain's delta against its start model
    chains = [
        (i, update_norm(plan.models[groups[r.group_id].start_model], r.final_weights))
        for i, r in enumerate(out)
        if groups[r.group_id].mode == "chain" and r.final_weights is not None and r.members
    ]
    bad, median = norm_outliers([n for _, n in chains], config.norm_factor, config.min_updates)
    ratios += [n / median for _, n in chains] if median > 0 else []
    for (i, norm), is_bad in zip(chains, bad, strict=True):
        if is_bad:
            r = out[i]
            rejections.append(Rejection(tuple(m.client_id for m in r.members), "chain", norm, median))
            out[i] = GroupResult(r.group_id, r.members, None, r.skipped)
    return out, rejections, max(ratios, default=float("nan"))


def screen_updates(
    updates: Mapping[str, np.ndarray], config: ScreeningConfig
) -> tuple[dict[str, np.ndarray], list[Rejection]]:
    """Pre-training updates (already ``w_after - w_start``) without the outliers."""
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
    return kept, rejections
