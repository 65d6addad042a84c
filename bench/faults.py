"""Faults on a site rehearsed on one machine, and what each costs.

FedGSP with direct hand-offs over ``--devices`` FEMNIST writers for ``--rounds`` rounds,
the coordinator as ``covey server run`` (its own process), agents as processes,
mosquitto with persistence; first undisturbed, then once per fault in the middle of
round 2: a device killed (kill -9) mid-chain and rebooted, the broker killed and
restarted, the coordinator killed (kill -9) and resumed with ``--resume``, one
device's connection cut at random (5 % chance every half second), every device
message duplicated and reordered. Prints a table and

``figure faults_lost_contributions = ...``  results devices trained that no round's model holds (summed)
``figure faults_acc_delta_pts = ...``      worst |accuracy - undisturbed accuracy| (points)
``figure faults_unfinished_runs = ...``    runs that did not finish every round
``figure faults_same_model_runs = ...``    runs whose final model equals the undisturbed one (|Δ| ≤ 1e-5)

Usage: ``python bench/faults.py [--rounds 5] [--devices 6]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--devices", type=int, default=6)
    parser.add_argument("--model", default="mlp_femnist")
    args = parser.parse_args()

    from server.lab.process_faults import FAULTS, run_with_fault
    from server.paths import ensure_model, femnist_dir

    model, root = ensure_model(args.model), femnist_dir()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for fault in ("none", *FAULTS):
            start = time.perf_counter()
            runs[fault] = run_with_fault(
                fault,
                root=root,
                model_path=model,
                work=Path(tmp) / fault,
                rounds=args.rounds,
                n_devices=args.devices,
            )
            print(f"# {fault}: {runs[fault].detail}, {time.perf_counter() - start:.0f} s", flush=True)
    base = runs["none"]
    print("| fault | finished | skipped | lost | accuracy (%) | Δ pts | same model |")
    print("|---|---|---|---|---|---|---|")
    deltas, same = [], 0
    for fault, r in runs.items():
        delta = abs(r.accuracy - base.accuracy) * 100
        diff = (
            float(np.max(np.abs(r.weights - base.weights)))
            if r.weights is not None and base.weights is not None
            else float("inf")
        )
        same += fault != "none" and diff <= 1e-5
        if fault != "none":
            deltas.append(delta)
        skipped = sum(int(x["skipped"]) for x in r.rounds)  # type: ignore[call-overload]
        print(
            f"| {fault} | {r.finished} | {skipped} | {r.lost} | {100 * r.accuracy:.1f} | {delta:.2f} | {diff <= 1e-5} |"
        )
    print(f"figure faults_lost_contributions = {sum(r.lost for r in runs.values())}")
    print(f"figure faults_acc_delta_pts = {max(deltas):.2f}")
    print(f"figure faults_unfinished_runs = {sum(not r.finished for r in runs.values())}")
    print(f"figure faults_same_model_runs = {same} of {len(runs) - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
