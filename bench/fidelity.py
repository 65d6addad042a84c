"""``bench/fidelity.py``: the reproductions issue 29 asks a reviewer would accept.

So far one part: FedAvg-IC's node grouping (Lee et al. Alg. 1, Eq. 10-12), 5 groups over
the 12 devices of ``examples/topologies/office.toml`` (MNIST split, the MLP), grouped
after round 1 as Alg. 1 does, on each of 3 seeds, two ways: with the office's RTT
matrix (FedAvg-IC) and on the data alone (FedAvg-I, ``alpha_comm = 0``). For each of
covey's default assignment (``balanced``) and Alg. 1 as written (``paper``) it prints
the largest group's share of the devices in the worst seed and setting:

* ``figure fedavgic_largest_group_share_max = …`` (``balanced``; target ≤ 0.5);
* ``figure fedavgic_paper_largest_group_share_max = …`` (``paper``, beside it).

Usage: ``python bench/fidelity.py [--seeds 0 1 2]``
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from server.simulation.config import SimulationConfig  # noqa: E402
from server.simulation.run import prepare, run_simulation  # noqa: E402

OFFICE = REPO / "examples" / "topologies" / "office.toml"
SETTINGS = {"office": True, "data_alone": False}  # with the office's RTTs, or FedAvg-I


def largest_share(assignment: str, seed: int, with_links: bool) -> tuple[float, str]:
    """The largest group's share after FedAvg-IC's one grouping, and the group sizes."""
    params: dict[str, object] = {"n_groups": 5, "assignment": assignment}
    if not with_links:
        params["alpha_comm"] = 0.0
    cfg = SimulationConfig(
        strategy="fedavg_ic",
        dataset="mnist",
        dataset_params={"clients": 12},
        model="mlp_mnist",
        rounds=2,  # round 1 ungrouped (its updates feed the IID cost), round 2 grouped
        seed=seed,
        strategy_params=params,
        topology=str(OFFICE),
        link_grouping=with_links,
    )
    run = prepare(cfg)
    result = run_simulation(run)
    assignment_of = getattr(run.strategy, "assignment", {})
    sizes = sorted(Counter(assignment_of.values()).values(), reverse=True)
    return float(result.records[1].extra["largest_group_share"]), "/".join(map(str, sizes))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    worst: dict[str, float] = {}
    for assignment in ("balanced", "paper"):
        for setting, with_links in SETTINGS.items():
            for seed in args.seeds:
                share, sizes = largest_share(assignment, seed, with_links)
                worst[assignment] = max(worst.get(assignment, 0.0), share)
                print(f"{assignment}, {setting}, seed {seed}: groups {sizes}, largest share {share:.2f}", flush=True)
    print(f"figure fedavgic_largest_group_share_max = {worst['balanced']:.2f}")
    print(f"figure fedavgic_paper_largest_group_share_max = {worst['paper']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
