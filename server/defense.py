"""The round driver's defences against dishonest devices, and the state they keep.

One :class:`Defense` per run, used by :class:`server.rounds.RoundDriver` in simulation
and on boards alike, in this order each round:

1. :meth:`Defense.bound` — sample counts at most what each device registered and a cap
   over the population (:mod:`server.claims`);
2. :meth:`Defense.screen` — updates refused or clipped against a reference built from
   the round, the last rounds and the server's own update (:mod:`server.screening`,
   :mod:`server.reference`); the accepted norms become history;
3. :meth:`Defense.guard` — after the strategy aggregated: a global model that is not
   finite, or that moved more than :data:`GUARD_FACTOR` times the reference (or, with
   no reference yet, more than its own norm times :data:`MODEL_GUARD`), is never
   applied: the previous one stays. This holds with screening off too (one ×10³⁰
   update froze such a run for good).

With ``screening=None`` the run has no bounds but the guard's: an update (or a relayed
hand-off) beyond :data:`GUARD_FACTOR` times the reference is refused, so the aggregate
of the others is applied instead of none.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from server.claims import Bounded, bound_claims
from server.screening import (
    EMPTY_REASON,
    Rejection,
    Screened,
    ScreeningConfig,
    lower_median,
    screen_results,
    update_norm,
)
from server.screening import REASON as SCREENED_REASON
from server.strategies.base import ClientInfo, GroupResult, RoundPlan

log = logging.getLogger("covey.server")
# The aggregate may move at most this many references: a mean of accepted updates moves
# at most one clipped update (3 references); a server optimizer's step is larger (FedAdam
# with η = 0.01 moved the FEMNIST MLP about 16 member references in a round).
GUARD_FACTOR = 1000.0
# screening off: the guard's bound only
OFF = ScreeningConfig(norm_factor=GUARD_FACTOR, clip_factor=None, hop_clip_factor=None, weight_cap=None)
MODEL_GUARD = 10.0  # without a reference: at most ten times the model's own norm
OVERCLAIM_REASON = "refused: sample count above registration"
AGGREGATE_REASON = "refused: aggregate not finite or exploding"
# (start model, the round's plan, the run's seed, samples) -> the norm of the server's update
ServerNorm = Callable[[np.ndarray, RoundPlan, int, int], float]


class Defense:
    """Bounds, screening and the aggregate guard of one run (see the module docstring).

    Parameters
    ----------
    config : the bounds; ``None``: none but the guard.
    reference : the server's own update norm for a plan's start model
        (``reference(start, plan, seed, n_samples)``), or ``None`` without server data.
    """

    def __init__(self, config: ScreeningConfig | None, reference: ServerNorm | None = None) -> None:
        self.config = config
        self.reference = reference
        rounds = config.history_rounds if config is not None else 3
        self.history: dict[str, deque[list[float]]] = {k: deque(maxlen=max(rounds, 1)) for k in ("member", "chain")}
        self.keep_history = rounds > 0 or config is None
        self._server_norm: tuple[tuple[int, int, int, int], float] | None = None  # the last one computed

    # -- 1. claims ----------------------------------------------------------------------
    def bound(self, results: Sequence[GroupResult], clients: Sequence[ClientInfo]) -> Bounded:
        registered = {c.client_id: int(c.n_samples) for c in clients}
        cap = self.config.weight_cap if self.config is not None else None
        return bound_claims(results, registered, cap)

    # -- 2. screening -------------------------------------------------------------------
    def past(self) -> dict[str, list[float]]:
        return {kind: [v for rnd in rounds for v in rnd] for kind, rounds in self.history.items()}

    def history_state(self) -> dict[str, list[list[float]]]:
        """The accepted norms of the last rounds, per kind, for a checkpoint: a resumed
        run screens its next round against the same reference as one never stopped."""
        return {kind: [[float(v) for v in rnd] for rnd in rounds] for kind, rounds in self.history.items()}

    def restore_history(self, state: Mapping[str, Sequence[Sequence[float]]]) -> None:
        """Take back :meth:`history_state`'s output (kinds it does not know are ignored)."""
        for kind, rounds in state.items():
            if kind in self.history:
                self.history[kind].clear()
                self.history[kind].extend([float(v) for v in rnd] for rnd in rounds)

    def server_norm(self, plan: RoundPlan, seed: int, clients: Sequence[ClientInfo]) -> float | None:
        """The server's update norm from the plan's first start model, as large as the
        median registered device; ``None`` without server data or groups."""
        if self.reference is None or not plan.groups:
            return None
        counts = [c.n_samples for c in clients if c.n_samples > 0]
        n = int(np.median(counts)) if counts else 1
        start = plan.models[plan.groups[0].start_model]
        key = (plan.round, id(start), n, seed)  # asked before the round (hand-offs) and after it
        if self._server_norm is None or self._server_norm[0] != key:
            self._server_norm = (key, float(self.reference(start, plan, seed, n)))
        return self._server_norm[1]

    def screen(self, plan: RoundPlan, results: Sequence[GroupResult], server: float | None) -> Screened:
        """Refuse and clip; remember what was accepted. With screening off only the guard's
        bound holds: an update beyond :data:`GUARD_FACTOR` times the reference (or not
        finite) is refused, so that one x10^30 update cannot stop every aggregate."""
        config = self.config if self.config is not None else OFF
        past = self.past() if self.config is None or self.config.history_rounds > 0 else {}
        screened = screen_results(plan, results, config, past, server)
        for kind, values in screened.accepted.items():
            if kind in self.history:
                self.history[kind].append(list(values))
        return screened

    # -- 3. the aggregate -----------------------------------------------------------------
    def guard(self, before: np.ndarray | None, after: np.ndarray | None) -> str | None:
        """Why the new global model ``after`` must not replace ``before`` (None: it may)."""
        if after is None or before is None:
            return None
        if not bool(np.isfinite(after).all()):
            return "the aggregate holds NaN or infinite values"
        moved = update_norm(before, after)
        scale = lower_median([v for rounds in self.history.values() for rnd in rounds for v in rnd])
        if np.isfinite(scale) and scale > 0:
            if moved > GUARD_FACTOR * scale:
                return f"the aggregate moved {moved:.4g}, more than {GUARD_FACTOR:g} x the reference {scale:.4g}"
            return None
        size = float(np.linalg.norm(np.asarray(before, np.float64)))
        if size > 0 and moved > MODEL_GUARD * size:
            return f"the aggregate moved {moved:.4g}, more than {MODEL_GUARD:g} x the model's norm {size:.4g}"
        return None


class Refusals:
    """What a round refused, until its record is written: screened updates
    (:class:`~server.screening.Rejection`) and single refusals (a hand-off, an
    overclaim, the aggregate), counted by reason and by device."""

    def __init__(self) -> None:
        self._refused: list[tuple[str, str | None]] = []  # (reason, device or None)
        self._rejections: list[Rejection] = []

    def refuse(self, reason: str, device: str | None = None) -> None:
        self._refused.append((reason, device))

    def screened(self, rejections: Sequence[Rejection]) -> None:
        self._rejections.extend(rejections)

    def tally(self, dropped: Mapping[str, int], rejected: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """``dropped`` (by reason) and ``rejected`` (by device) with this round's
        refusals added; the next round starts from none."""
        by_reason, by_device = dict(dropped), dict(rejected)
        counted: list[tuple[str, tuple[str, ...]]] = []
        for why, device in self._refused:
            counted.append((why, (device,) if device else ()))
        for r in self._rejections:
            counted.append((EMPTY_REASON if r.kind == "empty" else SCREENED_REASON, tuple(r.devices)))
        for reason, devices in counted:
            by_reason[reason] = by_reason.get(reason, 0) + 1
            for device in devices:
                by_device[device] = by_device.get(device, 0) + 1
        self._refused, self._rejections = [], []
        return by_reason, by_device
