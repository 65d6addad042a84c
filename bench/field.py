"""Field tests of FedAvg, DSC, FedAvg-IC and FedGSP on the office and field topologies.

Runs ``covey field-test TOPOLOGY --strategy NAME`` (the command a user types; docs/links.md)
for every pair, each on the same FEMNIST writers with the same seed, and reads each
run's ``field.json``. The target accuracy of a topology is 80 % of the best accuracy
FedAvg reached there (``--target-fraction``): the papers measure their savings against
FedAvg. The time to it is the wall time of the rounds up to the first that reaches it
(n/a: not within the rounds).

Prints, for the field topology (``field_``) and the office (``office_``):

``figure field_<strategy>_acc = ...`` (final server-side accuracy, %),
``figure field_<strategy>_time_to_target_s = ...``, ``figure field_<strategy>_round_s = ...``;
and from the office run:
``figure dsc_site_ari = ...`` (DSC's primary groups on the measured Γ against the sites),
``figure fedavgic_rtt_reduction_pct = ...`` (FedAvg-IC's groups: summed intra-group RTT,
on the topology, below random groups of the same sizes),
then a markdown table, and a plot per topology (``--plots DIR``).

Needs root (network namespaces) and mosquitto. About an hour on 2 cores.

Usage: ``python bench/field.py [--rounds 8] [--model mlp_femnist] [--out runs/bench-field]
[--plots docs/plots] [--topologies office field] [--strategies fedavg dsc fedavg_ic fedgsp] [--reuse]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from server.field.report import FieldReport, plot_field, time_to_target  # noqa: E402

STRATEGIES = ("fedavg", "dsc", "fedavg_ic", "fedgsp")
BASELINE = "fedavg"  # the method the papers measure their time savings against


def run_one(topology: str, strategy: str, args: argparse.Namespace) -> FieldReport:
    out = Path(args.out) / f"{topology}-{strategy}"
    if args.reuse and (out / "field.json").exists():
        print(f"reusing {out / 'field.json'}", flush=True)
        return FieldReport.from_dict(json.loads((out / "field.json").read_text()))
    argv = [sys.executable, "-m", "covey.cli", "field-test", str(REPO / "examples" / "topologies" / f"{topology}.toml")]
    argv += ["--strategy", strategy, "--rounds", str(args.rounds), "--model", args.model, "--out", str(out)]
    argv += ["--seed", str(args.seed), "--timeout", str(args.timeout)]
    print(f"$ covey field-test examples/topologies/{topology}.toml --strategy {strategy} ...", flush=True)
    # field-test stops itself after --timeout and removes its lab; the margin is for that
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=args.timeout + 300)
    if proc.returncode != 0:
        raise SystemExit(f"field test {topology}/{strategy} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    print("\n".join(proc.stdout.splitlines()[-9:]), flush=True)
    return FieldReport.from_dict(json.loads((out / "field.json").read_text()))


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None or not math.isfinite(v) else format(v, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--model", default="mlp_femnist")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench-field")
    p.add_argument("--plots", default=None, help="folder for field_<topology>.png")
    p.add_argument("--topologies", nargs="+", default=["office", "field"])
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per field test")
    p.add_argument(
        "--target-fraction", type=float, default=0.8, help="target: this fraction of FedAvg's best accuracy (0.8)"
    )
    p.add_argument("--reuse", action="store_true", help="read a finished test's field.json instead of running it")
    args = p.parse_args()

    rows = []
    for topology in args.topologies:
        reports = {s: run_one(topology, s, args) for s in args.strategies}
        if BASELINE not in reports:
            raise SystemExit(f"the target is a fraction of {BASELINE}'s accuracy: include it in --strategies")
        target = args.target_fraction * reports[BASELINE].best_accuracy
        prefix = topology
        for s, r in reports.items():
            reached, seconds = time_to_target(r.accuracy, r.round_wall_s, target)
            r.target, r.rounds_to_target, r.time_to_target_s = target, reached, seconds
            print(f"figure {prefix}_{s}_acc = {_fmt(100 * r.final_accuracy, '.2f')}")
            print(f"figure {prefix}_{s}_time_to_target_s = {_fmt(seconds)}")
            print(f"figure {prefix}_{s}_round_s = {_fmt(r.mean_round_s, '.2f')}")
            rows.append((topology, s, r))
        if topology == "office":
            if "dsc" in reports:
                print(f"figure dsc_site_ari = {_fmt(reports['dsc'].dsc_primary_site_ari, '.2f')}")
            if "fedavg_ic" in reports:
                print(f"figure fedavgic_rtt_reduction_pct = {_fmt(reports['fedavg_ic'].rtt_reduction_pct)}")
        if args.plots:
            path = Path(args.plots) / f"field_{topology}.png"
            plot_field(reports, path, title=f"{topology}.toml, {args.model}, {args.rounds} rounds", target=target)
            print(f"plot {path}")
    print()
    print(
        "| topology | strategy | final acc. (%) | target (%) | rounds to target | time to target (s) "
        "| s per round | groups | group site ARI | intra-group RTT vs random |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for topology, s, r in rows:
        print(
            f"| {topology} | {s} | {_fmt(100 * r.final_accuracy)} | {_fmt(100 * (r.target or math.nan))} "
            f"| {r.rounds_to_target or 'n/a'} | {_fmt(r.time_to_target_s)} | {_fmt(r.mean_round_s)} "
            f"| {len(r.groups)} | {_fmt(r.group_site_ari, '.2f')} | {_fmt(-r.rtt_reduction_pct, '+.0f')} % |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
