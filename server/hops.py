"""Screening each hand-off of a chain, so that one bad member costs only itself.

A chain's output is screened as a whole by the round driver (:mod:`server.screening`):
its norm per member against the reference. That cannot tell *which* member boosted its
update, and a chain whose output is refused throws away its honest members' training
too (FedGSP, one chain of seven, one member x100: every round refused, accuracy 0.2 %);
a boost under the chain's bound (x9 in a chain of seven) passes whole (37 % -> 17 %).
So when a chain's hand-offs pass through its group manager (relayed), each member's
own update, its output minus the model it was sent, is checked on arrival against a
reference fixed before the round starts, the same way as a parallel member's:

* refused above ``norm_factor`` times the reference, or when not finite: the chain
  goes on from the member's input, as if the member had been silent (FedGSP Sec. 3.2's
  skip), and the member is not credited;
* scaled down to ``hop_clip_factor`` times the reference above that (norm clipping;
  tighter than a parallel member's ``clip_factor``, because the chain passes the
  member's model on whole: :mod:`server.screening` says why).

The reference is the lower median of the accepted per-member norms of the last
``history_rounds`` rounds (parallel members, and chains divided by the square root of
their length) and the server's own update (:mod:`server.reference`): known before the
round, unlike the round's own median. With neither (round 1 without server data),
only non-finite hand-offs are refused.

Only a relayed hand-off can be screened: a direct one goes from member to member
without the manager seeing it. So ``--handoff auto`` relays
(``server/execution/round.py``); the simulator screens exactly the hand-offs the
coordinator relays. With screening off, only the aggregate guard's bound holds here
(1,000 times the reference) and non-finite hand-offs are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from server.defense import MODEL_GUARD, OFF
from server.screening import ScreeningConfig, lower_median, update_norm

HopVerdict = Literal["accepted", "clipped", "refused"]
HOP_REASON = "refused: hand-off screened, output not finite or training failed"  # in RoundRecord.dropped


@dataclass(frozen=True)
class HopBound:
    """The bound on one member's update inside a chain (see the module docstring).

    Parameters
    ----------
    reference : the per-member update norm it is measured against (``nan``: none known;
        then only a non-finite hand-off, or one that moved more than
        :data:`~server.defense.MODEL_GUARD` times its start model's norm, is refused).
    norm_factor : as :class:`~server.screening.ScreeningConfig`'s.
    clip_factor : its ``hop_clip_factor``.
    """

    reference: float
    norm_factor: float | None
    clip_factor: float | None

    def check(self, start: np.ndarray, out: np.ndarray) -> tuple[np.ndarray | None, HopVerdict]:
        """The member's output as the chain goes on with it: ``(out, "accepted")``, the
        clipped output, or ``(None, "refused")`` (the chain continues from ``start``).

        Parameters
        ----------
        start : the model the member was sent.
        out : what it returned.
        """
        if not bool(np.isfinite(out).all()):
            return None, "refused"
        norm = update_norm(start, out)
        if not (math.isfinite(self.reference) and self.reference > 0) or self.norm_factor is None:
            # no scale known yet (round 1 without server data): the aggregate guard's own
            # fallback, an update larger than MODEL_GUARD times the model it started from
            size = float(np.linalg.norm(np.asarray(start, np.float64)))
            too_far = not math.isfinite(norm) or (size > 0 and norm > MODEL_GUARD * size)
            return (None, "refused") if too_far else (out, "accepted")
        if not math.isfinite(norm) or norm > self.norm_factor * self.reference:
            return None, "refused"
        if self.clip_factor is not None and norm > self.clip_factor * self.reference:
            start64 = np.asarray(start, np.float64)
            step = (np.asarray(out, np.float64) - start64) * (self.clip_factor * self.reference / norm)
            return (start64 + step).astype(np.float32), "clipped"
        return out, "accepted"


def hop_bound(config: ScreeningConfig | None, past: dict[str, list[float]], server: float | None) -> HopBound:
    """The bound for this round's relayed hand-offs, from the accepted norms of past
    rounds (``past``: per kind, chains already per member) and the server's own update
    norm. With screening off (``None``, or no norm bound) only the aggregate guard's
    bound holds (:data:`server.defense.GUARD_FACTOR` times the reference, no clipping)."""
    if config is None or config.norm_factor is None:
        config = OFF
    values = [v for kind in ("member", "chain") for v in past.get(kind, [])]
    if server is not None and math.isfinite(server) and server > 0:
        values.append(float(server))
    enough = len(values) >= config.min_updates or server is not None
    reference = lower_median(values) if values and enough else float("nan")
    return HopBound(reference, config.norm_factor, config.hop_clip)
