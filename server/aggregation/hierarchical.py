"""The hierarchical schedule of FedAvg-IC (Lee et al., Eq. 4, Alg. 1) and HierFAVG.

Local SGD steps run on every node; every τ1 steps the group models are aggregated
(sample-weighted inside each group); every τ1·τ2 steps the global model is
aggregated over all nodes and broadcast. In covey's round-based drivers one round
is τ1 local steps followed by a group aggregation; every τ2-th *grouped* round is
global (rounds counted from the first grouped round, see :meth:`is_global_round`).

The defaults are the paper's experiments, (τ1, τ2) = (1, 5) (FedAvg-IC Sec. 6.1 and
Table 4: the product of the learning steps is 5, as for FedAvg's τ = 5).
"""

from __future__ import annotations

from dataclasses import dataclass

from server.errors import GroupingError


@dataclass(frozen=True)
class HierarchicalSchedule:
    tau1: int = 1
    tau2: int = 5

    def __post_init__(self) -> None:
        if self.tau1 < 1 or self.tau2 < 1:
            raise GroupingError(f"τ1 and τ2 must be at least 1, got {self.tau1}, {self.tau2}")

    def is_global_round(self, r: int) -> bool:
        """Grouped round ``r`` (counted from 1 at the first grouped round) ends with a
        global aggregation: every τ2-th one (Alg. 1 line 10 with one round = τ1 steps).
        An ungrouped warm-up round (FedAvg-IC's round 1) is not counted."""
        return r % self.tau2 == 0

    def steps_per_round(self) -> int:
        return self.tau1
