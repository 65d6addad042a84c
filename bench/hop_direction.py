"""Could a direction test screen chain hand-offs? Honest hops against the server's update.

A chain of the first ``--devices`` FEMNIST writers trains ``--rounds`` rounds (MLP,
FedGSP's FEMNIST settings as ``bench/insider.py`` trains them: 1 epoch, batch 5, lr
0.01); in each round every member's hop update (its output minus
the model it received) is compared, by cosine, with the update the server trains on 300
held-out samples from the round's start model (FLTrust's reference, Cao et al. 2021),
and a random direction is compared the same way. A test "cosine below τ: refuse" can
only work if honest hops stay above every τ that random directions reach; a test
"|cosine| below τ: refuse" (a hop that says nothing of the task) only if honest hops
stay above the random directions' largest |cosine|.

Prints ``figure hop_cos_min``, ``figure hop_cos_median_first``, ``figure
hop_cos_median_last``, ``figure random_cos_max_abs`` and ``figure
honest_hops_within_random_frac`` (the share of honest hops whose |cosine| is at most
``random_cos_max_abs``: what the second test would refuse).

Usage: ``python bench/hop_direction.py [--rounds 60] [--devices 7]``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from covey.paths import ensure_model, femnist_dir  # noqa: E402
from device.data import Dataset, read_leaf  # noqa: E402
from device.runtime import TFLiteModel  # noqa: E402
from device.training import train_locally  # noqa: E402
from server.fleet import leaf_writers  # noqa: E402
from server.strategies.base import TrainConfig  # noqa: E402


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--devices", type=int, default=7)
    args = parser.parse_args(argv)
    root = femnist_dir()
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    held = Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))
    rng = np.random.default_rng(0)
    pick = rng.permutation(len(held))[:300]
    server_data = Dataset(held.x[pick], held.y[pick])
    model = TFLiteModel(ensure_model("mlp_femnist"), num_threads=1)
    settings = TrainConfig(1, 5, 0.01).to_wire()
    weights = model.get_weights().copy()
    honest: list[list[float]] = []
    random: list[float] = []
    for rnd in range(1, args.rounds + 1):
        server = train_locally(model, server_data, settings, start=weights, seed=1, rnd=rnd, device_id="server")
        reference = server.weights - weights
        current, row = weights.copy(), []
        for k, writer in enumerate(leaf_writers(root, args.devices)):
            out = train_locally(model, train[writer], settings, start=current, seed=1, rnd=rnd, device_id=f"dev{k:03d}")
            row.append(cosine(out.weights - current, reference))
            random.append(cosine(rng.standard_normal(reference.shape).astype(np.float32), reference))
            current = out.weights
        weights = current
        honest.append(row)
        print(
            f"round {rnd:2d}: honest hops {min(row):+.3f} .. {max(row):+.3f}, median {np.median(row):+.3f}", flush=True
        )
    print(f"figure hop_cos_min = {min(min(r) for r in honest):.3f}")
    print(f"figure hop_cos_median_first = {np.median(honest[0]):.3f}")
    print(f"figure hop_cos_median_last = {np.median(honest[-1]):.3f}")
    random_max = max(abs(c) for c in random)
    print(f"figure random_cos_max_abs = {random_max:.4f}")
    within = float(np.mean([abs(c) <= random_max for row in honest for c in row]))
    print(f"figure honest_hops_within_random_frac = {within:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
