"""Grouping speed and quality, in one run. Medians over repeated runs.

Prints::

    figure icg_k364_ms = ...            ICG at FedGSP's scale (K=364, f=52, F=62, τ=10)
    figure icg_k10000_s = ...           ICG at K=10,000, f=100
    figure dsc_k1000_s = ...            DSC (two affinity propagations) on K=1,000
    figure coldstart_s = ...            FedGroup cold start, 100 clients x 3.3 M parameters
    figure coldstart_peak_mb = ...      peak RSS of that process (the update matrix is 1.3 GB)
    figure icg_cpd_reduction_pct = ...  FEMNIST: median group CPD, ICG vs random groups

Usage: ``python bench/grouping.py [--repeats N] [--skip-coldstart]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def leaf_like_counts(k: int, n_classes: int = 62, mean_samples: int = 226, seed: int = 0) -> np.ndarray:
    """Class counts shaped like LEAF FEMNIST writers: skewed label mixes, varied sizes."""
    rng = np.random.default_rng(seed)
    sizes = rng.poisson(mean_samples, k) + 10
    mix = rng.dirichlet(np.full(n_classes, 0.5), size=k)
    return np.array([rng.multinomial(n, p) for n, p in zip(sizes, mix, strict=True)], np.float64)


def timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _coldstart_child(n: int, d: int, queue: mp.Queue) -> None:
    from server.grouping.fedgroup import cold_start_groups

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((5, d), dtype=np.float32)
    updates = np.empty((n, d), np.float32)  # the 1.3 GB update matrix
    for i in range(n):
        updates[i] = centres[i % 5]
        updates[i] += rng.standard_normal(d, dtype=np.float32)
    del centres
    start = time.perf_counter()
    labels = cold_start_groups(updates, 5, random_state=0)
    elapsed = time.perf_counter() - start
    queue.put({"s": elapsed, "peak_mb": _peak_rss_mb(), "groups": len(set(labels.tolist()))})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--skip-coldstart", action="store_true", help="skip the 1.3 GB cold-start run")
    args = parser.parse_args()

    from server.grouping.dsc import dsc_groups
    from server.grouping.icg import icg_groups

    counts364 = leaf_like_counts(364)
    icg_groups(counts364, 52, random_state=0)  # warm-up (imports, OR-Tools)
    seeds = iter(range(10_000))
    ms = 1e3 * timed(lambda: icg_groups(counts364, 52, max_iter=10, random_state=next(seeds)), args.repeats)
    print(f"figure icg_k364_ms = {ms:.2f}", flush=True)

    counts10k = leaf_like_counts(10_000, seed=1)
    s = timed(lambda: icg_groups(counts10k, 100, max_iter=10, random_state=next(seeds)), max(3, args.repeats // 2))
    print(f"figure icg_k10000_s = {s:.3f}", flush=True)

    rng = np.random.default_rng(2)
    pos = rng.uniform(0, 100, (1000, 2))
    dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    snr = 40 - 20 * np.log10(1 + dist)  # dB, falls with distance
    counts1k = leaf_like_counts(1000, n_classes=10, mean_samples=600, seed=3)
    s = timed(lambda: dsc_groups(snr, counts1k, random_state=0), 3)
    print(f"figure dsc_k1000_s = {s:.3f}", flush=True)

    if not args.skip_coldstart:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_coldstart_child, args=(100, 3_300_000, queue))
        proc.start()
        res = queue.get(timeout=1200)
        proc.join(timeout=60)
        print(f"figure coldstart_s = {res['s']:.3f}", flush=True)
        print(f"figure coldstart_peak_mb = {res['peak_mb']:.0f}", flush=True)

    from covey.paths import femnist_dir
    from device.data import class_counts, read_leaf
    from server.metrics import pairwise_cpd

    train = read_leaf(femnist_dir() / "train")
    counts = np.array([class_counts(d.y, 62) for d in train.values()], np.float64)
    icg_cpd, rand_cpd = [], []
    for seed in range(20):
        groups, _, _ = icg_groups(counts, 10, random_state=seed)
        icg_cpd.append(np.median(pairwise_cpd(counts, groups)))
        cuts = np.cumsum([len(g) for g in groups])[:-1]
        same = np.split(np.random.default_rng(1000 + seed).permutation(len(counts)), cuts)
        rand_cpd.append(np.median(pairwise_cpd(counts, same)))
    reduction = 100 * (1 - np.mean(icg_cpd) / np.mean(rand_cpd))
    print(f"figure icg_cpd_reduction_pct = {reduction:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
