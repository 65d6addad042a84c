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
``random_cos_max_abs``: what the second test would refuse). And a loss test (Zeno, Xie
et al. 2019: refuse a hop that raises the server's held-out loss): ``figure
random_hop_loss_delta_max_abs`` (how far a random direction at the honest norm moves
that loss) and ``figure honest_hops_raising_loss_frac`` (the share of honest hops that
raise it by more: what a loss test that refuses the random direction's harm would
refuse).

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
    loss_honest: list[float] = []  # the server's held-out loss after a hop minus before it
    loss_random: list[float] = []

    def server_loss(w: np.ndarray) -> float:
        model.set_weights(w)
        return float(model.evaluate(server_data.x, server_data.y).loss)

    for rnd in range(1, args.rounds + 1):
        server = train_locally(model, server_data, settings, start=weights, seed=1, rnd=rnd, device_id="server")
        reference = server.weights - weights
        current, row = weights.copy(), []
        for k, writer in enumerate(leaf_writers(root, args.devices)):
            out = train_locally(model, train[writer], settings, start=current, seed=1, rnd=rnd, device_id=f"dev{k:03d}")
            hop = out.weights - current
            noise = rng.standard_normal(reference.shape).astype(np.float32)
            row.append(cosine(hop, reference))
            random.append(cosine(noise, reference))
            before = server_loss(current)
            loss_honest.append(server_loss(out.weights) - before)
            loss_random.append(server_loss(current + noise * (np.linalg.norm(hop) / np.linalg.norm(noise))) - before)
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
    # Zeno's test (Xie et al. 2019): a hop that raises the server's held-out loss is
    # refused. A random direction at the honest norm barely moves it; honest hops move it
    # both ways, far more
    random_loss = max(abs(d) for d in loss_random)
    print(f"figure random_hop_loss_delta_max_abs = {random_loss:.4f}")
    print(f"figure honest_hops_raising_loss_frac = {float(np.mean([d > random_loss for d in loss_honest])):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
