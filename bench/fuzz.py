"""Fuzz every decoder of untrusted input with generated and mutated inputs.

Decoders (``server/lab/fuzzing/targets.py``): model frames and their reassembly, control
messages of every type, model manifests, device config files (``covey-device
--config``) and simulation config files (``covey simulate --config``). Inputs are
drawn by hypothesis from valid templates with fields swapped for arbitrary values,
and mutated from valid encodings byte by byte (flips, truncations, insertions,
splices) and field by field (type swaps, huge numbers, deep nesting, unknown keys).
An exception that is not covey's own ``CoveyError`` is a crash; the first few are
printed with their input.

``figure fuzz_inputs = ...``, ``figure fuzz_crashes = ...`` (and per target), summed over
``--seeds`` runs (seeds ``--seed``, ``--seed + 1``, ...), each of ``--inputs`` inputs.

Usage: ``python bench/fuzz.py [--inputs 100000] [--seed 0] [--seeds 1] [--generated 0.1]``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from server.lab.fuzzing import run_fuzz  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=100_000, help="inputs in total, split over the decoders")
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument("--seeds", type=int, default=1, help="how many seeds to run, from --seed on")
    p.add_argument("--generated", type=float, default=0.1, help="share of inputs drawn by hypothesis")
    p.add_argument("--show", type=int, default=5, help="crashing inputs to print")
    args = p.parse_args()

    total_inputs = total_crashes = 0
    for seed in range(args.seed, args.seed + args.seeds):
        report = run_fuzz(args.inputs, random_state=seed, generated_fraction=args.generated)
        print(f"seed {seed}:")
        for name, n in report.inputs.items():
            crashes = sum(1 for c in report.crashes if c.target == name)
            refused = report.refused.get(name, 0)
            print(f"  {name:<18} {n:>7} inputs, {refused:>7} refused with a covey error, {crashes} crashes")
        for (target, kind), n in sorted(report.crash_kinds().items(), key=lambda kv: -kv[1]):
            print(f"    {n:>6} x {target}: {kind}")
        for crash in report.crashes[: args.show]:
            print(crash.describe())
        print(f"  {report.total_inputs} inputs in {report.seconds:.0f} s", flush=True)
        total_inputs += report.total_inputs
        total_crashes += len(report.crashes)
    print(f"figure fuzz_inputs = {total_inputs}")
    print(f"figure fuzz_crashes = {total_crashes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
