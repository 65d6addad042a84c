"""Noisy uplinks in the simulator: DSC's communication model (Sun et al., Sec. II-B, Eq. 6).

The letter's devices send their gradients over a block-fading channel to the base
station, ``y = h p s + n0`` with ``n0 ~ CN(0, σ²)`` and received SNR
``γ = p |h|² / σ²`` (perfect channel state information, so the receiver divides by
``h p``). What arrives is the sent vector plus white Gaussian noise whose power per
entry is the signal's over ``γ``:

``ŝ = s + n``, ``n ~ N(0, P_s / γ)`` entry-wise, ``P_s = mean(s²)``  (:func:`received`).

That is the analog (uncoded) transmission the letter models; a digital link with
coding and retransmission would instead lose or delay whole packets. Updates travel,
not models: ``s`` is a model minus the start model it was trained from.

Which links a round's updates cross (:class:`NoisyUplinks`, ``--channel awgn``), with
Γ (dB) from the run's topology (diagonal: device to server):

* a parallel group whose strategy uses one aggregate of it (``mean_only``; DSC's
  groups, Eq. 2-3): each member's update goes to the group's leader over
  ``Γ[member, leader]`` (the leader's own does not travel), the leader aggregates them
  by the group's rule (Eq. 2 with Eq. 4's weights) and sends the aggregate to the
  server over ``Γ[leader, leader]``. The group returns that one model, as a group run
  at a site's edge does. The leader is the member with the highest mean Γ to the
  others (the letter's leader is its affinity-propagation exemplar, which the grouping
  does not return; in a group formed by link quality the two agree up to ties);
* any other parallel group: each member's update to the server over ``Γ[k, k]``;
* a chain: its last model to the server over ``Γ[last, last]``. Hand-offs between
  members are not corrupted (the round has moved on when the simulator sees them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from device.errors import ConfigError

if TYPE_CHECKING:  # the CLI imports CHANNELS; the round's types load with a run
    from server.strategies.base import GroupPlan, GroupResult, MemberResult, RoundPlan

ChannelKind = Literal["none", "awgn"]
CHANNELS: tuple[ChannelKind, ...] = ("none", "awgn")
CHANNEL_STREAM = 0xC4A77E1  # the channel's own generator stream beside the run's seed


def received(update: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``update`` as it arrives over a link of received SNR ``snr_db`` (module docstring).

    Parameters
    ----------
    update : the sent vector (a model minus its start model).
    snr_db : the link's received SNR in dB; ``inf`` is a noiseless link.
    rng : the channel's generator.

    Returns
    -------
    np.ndarray
        float32, ``update`` plus white Gaussian noise of power ``mean(update²) / γ``.
    """
    s = np.asarray(update, np.float64)
    if not np.isfinite(snr_db):
        return s.astype(np.float32)
    power = float(np.mean(s * s)) if s.size else 0.0
    sigma = np.sqrt(power / 10.0 ** (snr_db / 10.0))
    return (s + rng.normal(0.0, sigma, s.shape)).astype(np.float32)


def leader_of(members: Sequence[str], index: Mapping[str, int], snr_db: np.ndarray) -> str:
    """The member with the highest mean Γ (dB) to the group's other members (the first
    of equal ones); a group of one leads itself."""
    if len(members) == 1:
        return members[0]
    rows = [index[m] for m in members]
    sub = snr_db[np.ix_(rows, rows)]
    others = ~np.eye(len(rows), dtype=bool)
    mean_to_others = np.array([sub[i, others[i]].mean() for i in range(len(rows))])
    return members[int(np.argmax(mean_to_others))]


@dataclass
class NoisyUplinks:
    """The links of one run's topology, corrupting what crosses them (module docstring).

    Parameters
    ----------
    ids : the clients, in Γ's order.
    snr_db : Γ (dB), square over ``ids``; diagonal: device to server.
    rng : the channel's own generator (seeded from the run's seed and
        :data:`CHANNEL_STREAM`, so the training's draws are the same with or without it).
    """

    ids: Sequence[str]
    snr_db: np.ndarray
    rng: np.random.Generator

    def __post_init__(self) -> None:
        self.snr_db = np.asarray(self.snr_db, np.float64)
        if self.snr_db.shape != (len(self.ids), len(self.ids)):
            raise ConfigError(f"the channel's Γ is {self.snr_db.shape} for {len(self.ids)} clients")
        self.index = {c: i for i, c in enumerate(self.ids)}

    def _to_server(self, weights: np.ndarray, start: np.ndarray, sender: str) -> np.ndarray:
        i = self.index[sender]
        return (start + received(weights - start, self.snr_db[i, i], self.rng)).astype(np.float32)

    def _through_leader(self, group: GroupPlan, result: GroupResult, start: np.ndarray) -> GroupResult:
        sent = [m for m in result.members if m.weights is not None]
        if not sent:
            return result
        leader = leader_of([m.client_id for m in sent], self.index, self.snr_db)
        li = self.index[leader]

        def to_leader(m: MemberResult) -> MemberResult:
            if m.client_id == leader or m.weights is None:
                return m
            snr = self.snr_db[self.index[m.client_id], li]
            return replace(m, weights=start + received(m.weights - start, snr, self.rng), norm=None)

        arrived = tuple(to_leader(m) for m in result.members)
        from server.execution.group_model import group_model

        mean = group_model(replace(result, members=arrived), group.group_rule, start)
        assert mean is not None  # a member sent a model
        upload = self._to_server(mean, start, leader)
        members = tuple(replace(m, weights=None, norm=None) for m in result.members)
        return replace(result, members=members, group_mean=upload, managed_by=f"leader {leader}")

    def apply(self, plan: RoundPlan, results: Sequence[GroupResult]) -> list[GroupResult]:
        """``results`` as the server receives them over the noisy links.

        Parameters
        ----------
        plan : the round's plan (the groups' start models, modes and rules).
        results : what the devices sent, one per group.

        Returns
        -------
        list of GroupResult
            Members' models corrupted on their way, or (``mean_only`` groups) the
            leader's corrupted aggregate as the group's one model.
        """
        by_id = {g.group_id: g for g in plan.groups}
        out: list[GroupResult] = []
        for r in results:
            group = by_id[r.group_id]
            start = np.asarray(plan.models[group.start_model], np.float64)
            if r.group_mean is not None or r.edge_means:  # already aggregated elsewhere
                out.append(r)
            elif group.mode == "chain":
                if r.final_weights is not None and r.members:
                    last = r.members[-1].client_id
                    r = replace(r, final_weights=self._to_server(r.final_weights, start, last))
                out.append(r)
            elif group.mean_only:
                out.append(self._through_leader(group, r, start))
            else:
                members: list[MemberResult] = [
                    m
                    if m.weights is None
                    else replace(m, weights=self._to_server(m.weights, start, m.client_id), norm=None)
                    for m in r.members
                ]
                out.append(replace(r, members=tuple(members)))
        return out
