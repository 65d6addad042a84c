"""The one model a group sends up from its members' (at a site's edge, or a simulated
group leader under a noisy channel, :mod:`server.simulation.channel`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.aggregation.dsc_weights import angle_weights
from server.aggregation.fedavg import weighted_average
from server.strategies.base import GroupResult, GroupRule


def group_model(
    result: GroupResult, rule: GroupRule = "sample_mean", start: np.ndarray | None = None
) -> np.ndarray | None:
    """The one model a group sends up: a chain's last, or the parallel members' models
    aggregated by ``rule``: their sample-weighted mean (FedAvg-IC Eq. 5's group
    aggregation), or ``start`` plus DSC's angle-weighted update (Sun et al. Eq. 2 with
    Eq. 4's weights, as :class:`~server.strategies.dsc.DSC` aggregates a group). None if
    no member returned a model.

    Parameters
    ----------
    result : the group's result at the edge.
    rule : how the members' models become one (:data:`~server.strategies.base.GroupRule`).
    start : the group's start model (``dsc_angle`` needs it: the updates are taken from it).

    Returns
    -------
    np.ndarray or None
        float32, the shape of the members' models.
    """
    if result.final_weights is not None:
        return np.asarray(result.final_weights, np.float32)
    returned: Sequence[tuple[np.ndarray, int]] = [
        (m.weights, m.n_samples) for m in result.members if m.weights is not None and m.n_samples > 0
    ]
    if not returned:
        return None
    if rule == "dsc_angle":
        if start is None:
            raise ValueError("the dsc_angle rule needs the group's start model")
        w = np.asarray(start, np.float64)
        updates = np.stack([m for m, _ in returned]).astype(np.float64) - w
        weights = angle_weights(-updates, np.array([n for _, n in returned]))
        return (w + weights @ updates).astype(np.float32)
    return weighted_average([w for w, _ in returned], [n for _, n in returned])
