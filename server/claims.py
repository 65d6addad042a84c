"""What a device claims about its data never buys it weight.

FedAvg's mean, FedGSP's chain average and every strategy built on them weigh a model by
the sample count its device reports (McMahan et al. 2017). A board with valid
credentials may report anything up to the protocol's cap (2³¹−1): with ``n_samples =
10⁹`` and a random direction at an honest norm, one board took a FEMNIST run from 62 %
to 0 % (issue 26). The round driver therefore bounds every member's count before a
strategy sees it:

* by what the device **registered** (a result never raises it; the registry is not
  rewritten by results), and
* by ``weight_cap`` times the **upper quartile of the registered counts** over the
  run's devices: a robust scale of the population (devices lying together move it only
  when they are a quarter of the run), and one that follows its spread, so a board that
  registered 10⁹ samples weighs at most ``weight_cap`` upper-quartile devices while an
  honest population of uneven sizes keeps its weights.

A count beyond its own registration is counted against the device (``rejected``) as an
implausible claim; a count above the population cap is not (an honest device may hold
more data than most) and only appears in the round's ``extra`` as ``weights_capped``.
Why ``weight_cap`` 2 and the upper quartile: the 51 FEMNIST writers of the sample hold
7 to 165 training samples (upper quartile 160), so the cap (about 320) weighs no honest
writer down, and a liar among seven weighs at most about a quarter of a round, so a
random direction at that weight can no longer take over the average, as it did without
the cap (the run fell to 0.2 %). On Synthetic(1,1), whose sizes are lognormal (the
largest of 30 clients holds about ten medians), a cap of 2 medians weighed honest large
clients down and cost FedAvg-IC accuracy; the upper quartile (about 3.5 medians there)
lets such a population keep its weights. What a liar still costs under the cap is
measured in docs/results.md, "A dishonest board".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from server.strategies.base import ClientInfo, GroupResult


@dataclass(frozen=True)
class Bounded:
    """The results with bounded counts, the devices that claimed beyond their own
    registration, and how many members the population cap weighed down."""

    results: list[GroupResult]
    overclaimed: list[str]
    capped: int


def population_cap(registered: Mapping[str, int], weight_cap: float | None) -> float:
    """The most samples any member may weigh: ``weight_cap`` times the upper quartile
    of the registered counts (infinite without a cap or without registered devices)."""
    counts = [n for n in registered.values() if n > 0]
    if weight_cap is None or not counts:
        return float("inf")
    return float(weight_cap) * float(np.percentile(counts, 75))


def bounded_infos(clients: Sequence[ClientInfo], weight_cap: float | None) -> list[ClientInfo]:
    """The clients as strategies see them for grouping and sampling: a registration
    above the population cap (:func:`population_cap`) is scaled down to it, its class
    counts in proportion. A board that registers 10⁹ samples would otherwise dominate
    every group's class distribution it joins (ICG sums counts), and with it where the
    strategy puts it (FedGSP, 2 chains, before grouping saw bounded counts: a random
    direction at an honest norm cost 9 points with such a count, 2.5 with an honest one)."""
    cap = population_cap({c.client_id: int(c.n_samples) for c in clients}, weight_cap)
    return [bounded_info(c, cap) for c in clients]


def bounded_info(client: ClientInfo, cap: float) -> ClientInfo:
    """``client`` with its counts scaled down to at most ``cap`` samples."""
    if not client.n_samples > cap:
        return client
    n = max(1, int(cap))
    counts = np.asarray(client.class_counts, np.float64)
    scaled = np.floor(counts * (n / max(float(counts.sum()), 1.0))).astype(np.int64)
    scaled[int(np.argmax(counts))] += n - int(scaled.sum())  # still summing to its count
    return replace(client, n_samples=n, class_counts=scaled)


def bound_claims(results: Sequence[GroupResult], registered: Mapping[str, int], weight_cap: float | None) -> Bounded:
    """Every member's ``n_samples`` at most its registered count and the population cap.

    Parameters
    ----------
    results : the round's results as they came back.
    registered : each device's registered sample count (:meth:`Backend.clients`).
    weight_cap : the cap in median registered counts, or ``None``.
    """
    cap = population_cap(registered, weight_cap)
    out, overclaimed, capped = [], [], 0
    for r in results:
        members = []
        for m in r.members:
            n = m.n_samples
            own = registered.get(m.client_id)
            if own is not None and n > own:
                overclaimed.append(m.client_id)
                n = own
            if n > cap:
                capped += 1
                n = int(cap)
            members.append(m if n == m.n_samples else replace(m, n_samples=n))
        out.append(replace(r, members=tuple(members)))
    return Bounded(out, overclaimed, capped)
