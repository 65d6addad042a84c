"""Modelled time and traffic of a round, FedGSP Sec. 4.1, Eq. (15)-(17).

Both drivers record these figures next to what they measure, so a simulated run and
a run on boards report the same modelled costs for the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from server.strategies.base import Aggregation, GroupResult, RoundPlan


@dataclass(frozen=True)
class CostModel:
    """FedGSP's defaults: 96 MFLOPs per training sample, 6.3 MFLOPs per aggregated
    model, a 567 GFLOPS device (Snapdragon 835 / Adreno 540), 567 Mbit/s in and out.
    The model size comes from the actual weights."""

    flops_per_sample: float = 96e6
    flops_per_aggregation: float = 6.3e6
    device_flops: float = 567e9
    rate_in_bps: float = 567e6
    rate_out_bps: float = 567e6

    def round_costs(
        self,
        plan: RoundPlan,
        results: Sequence[GroupResult],
        epochs: int,
        model_bytes: int,
        aggregation: Aggregation = "server",
    ) -> dict[str, float]:
        """``t_comp_s`` (Eq. 15), ``t_comm_s`` (Eq. 16-17) and ``bytes`` of one round.

        Parameters
        ----------
        plan, results : the round's plan and what came back (samples per member).
        epochs : local epochs.
        model_bytes : size of one model.
        aggregation : where parallel groups' models met; FedGSP's model has one
            rate for every transfer, so only a topology's model
            (:class:`server.simulation.topology.TopologyCostModel`) tells them apart.

        Returns
        -------
        dict : modelled computation time, communication time and bytes moved.
        """
        longest = 0  # Eq. (15): the longest sequential workload (a chain trains its members in turn)
        models = downloads = uploads = 0
        for g, r in zip(plan.groups, results, strict=True):
            counts = [m.n_samples for m in r.members]
            if g.mode == "chain":
                longest = max(longest, sum(counts))
                models += 1
                downloads += len(g.members)  # the first gets the model, each successor the hand-off
                uploads += len(g.members)  # each hands on; the last returns the chain's model
            else:
                longest = max([longest, *counts])
                models += len(g.members)
                downloads += len(g.members)
                uploads += len(g.members)
        comp = self.flops_per_sample / self.device_flops * longest * epochs
        comp += self.flops_per_aggregation / self.device_flops * max(models - 1, 0)
        comm = 8 * model_bytes * (downloads / self.rate_in_bps + uploads / self.rate_out_bps)  # Eq. (16)-(17)
        # t_round_s: the modelled time of the round (a topology's cost model times its links)
        return {
            "t_comp_s": comp,
            "t_comm_s": comm,
            "t_round_s": comp + comm,
            "bytes": float(model_bytes * (downloads + uploads)),
        }
