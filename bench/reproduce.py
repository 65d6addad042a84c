"""Reproduce the papers' headline comparisons in simulation, and time them.

Parts (run all, or pick with ``--part``):

``synthetic``
    Synthetic(1,1), MCLR, 100 users, FlexCFL's settings (20 clients per round, 10
    epochs, batch 10, lr 0.01, 5 groups, 300 rounds); FedAvg, FedProx, IFCA, FeSEM,
    FedGroup, FlexCFL over ``--seeds``. Maximum weighted test accuracy over rounds
    (FlexCFL Table 3's measure). Prints ``synthetic11_<strategy>_acc`` (mean over
    seeds, %), ``synthetic11_<strategy>_acc_spread`` and ``synthetic11_flexcfl_300r_s``.
``femnist``
    The shared LEAF FEMNIST sample (51 writers), batch 5, 1 epoch, lr 0.01: FedAvg,
    FedProx, FedAdam, FedYogi (15 clients per round, ≈ κ·K), NaiveGSP, NaiveGSP+ICG and
    FedGSP (LOG, α = 2, κ = 0.3, β scaled from 10 for 368 clients to 2 for 51). The
    target accuracy is FedAvg's final accuracy; prints ``femnist_<strategy>_acc``
    (final, %) and ``femnist_<strategy>_rounds_to_target``.
``femnist_time``
    FedGSP on FEMNIST with the CNN for 100 rounds: ``femnist_fedgsp_100r_s``.
``shift``
    FlexCFL on Synthetic(1,1) with swap-all distribution shift (p = 0.05), with and
    without migration: ``shift_migration_acc_delta`` (best accuracy with minus
    without, points) and ``shift_migrated_clients``.

Results (JSON/CSV per run, a markdown table and a plot per part) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from server.simulation.config import SimulationConfig  # noqa: E402
from server.simulation.run import RunResult, comparison_table, plot_results, run_simulation, write_result  # noqa: E402


def figure(name: str, value: float) -> None:
    print(f"figure {name} = {value:.3f}" if isinstance(value, float) else f"figure {name} = {value}", flush=True)


def run(cfg: SimulationConfig, out: Path, label: str) -> RunResult:
    start = time.perf_counter()
    result = run_simulation(cfg)
    write_result(result, out, f"{label}_seed{cfg.seed}")
    print(
        f"# {label} seed {cfg.seed}: best {result.best_accuracy:.2%} final {result.final_accuracy:.2%} "
        f"({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    return result


def part_synthetic(args: argparse.Namespace, out: Path) -> None:
    base = SimulationConfig(
        dataset="synthetic",
        dataset_params={"alpha": 1.0, "beta": 1.0, "users": 100},
        rounds=args.rounds or 300,
        epochs=10,
        batch=10,
        lr=0.01,
        workers=args.workers,
    )
    strategies = {
        "fedavg": {"clients_per_round": 20, "warmup": "round_robin"},
        "fedprox": {"clients_per_round": 20, "warmup": "round_robin", "mu": 0.01},
        "ifca": {"clients_per_round": 20, "warmup": "round_robin", "n_groups": 5},
        "fesem": {"clients_per_round": 20, "warmup": "round_robin", "n_groups": 5},
        "fedgroup": {"clients_per_round": 20, "n_groups": 5},
        "flexcfl": {"clients_per_round": 20, "n_groups": 5},
    }
    runs: dict[str, list[RunResult]] = {}
    for name, params in strategies.items():
        for seed in args.seeds:
            cfg = base.with_overrides(strategy=name, strategy_params=params, seed=seed)
            runs.setdefault(name, []).append(run(cfg, out, f"synthetic11_{name}"))
    for name, results in runs.items():
        best = np.array([r.best_accuracy for r in results]) * 100
        figure(f"synthetic11_{name}_acc", float(best.mean()))
        figure(f"synthetic11_{name}_acc_spread", float(best.max() - best.min()))
    figure("synthetic11_flexcfl_300r_s", float(np.mean([r.seconds for r in runs["flexcfl"]])))
    (out / "synthetic11.md").write_text(comparison_table(runs))
    plot_results(runs, out / "synthetic11.png", title="Synthetic(1,1), MCLR, 100 users")


def part_femnist(args: argparse.Namespace, out: Path) -> None:
    model = args.femnist_model
    base = SimulationConfig(
        dataset="femnist",
        model=model,
        rounds=args.rounds or 100,
        epochs=1,
        batch=5,
        lr=0.01,
        workers=args.workers,
        seed=args.seeds[0],
    )
    per_round = {"clients_per_round": 15}
    gsp = {"kappa": 0.3, "beta": 2}
    strategies = {
        "fedavg": per_round,
        "fedprox": {**per_round, "mu": 0.01},
        "fedadam": {**per_round, "server_lr": 0.01},
        "fedyogi": {**per_round, "server_lr": 0.01},
        "naivegsp": gsp,
        "naivegsp_icg": gsp,
        "fedgsp": {**gsp, "growth": "log", "alpha": 2.0},
    }
    runs = {
        name: [run(base.with_overrides(strategy=name, strategy_params=params), out, f"femnist_{name}")]
        for name, params in strategies.items()
    }
    target = runs["fedavg"][0].final_accuracy
    figure("femnist_target_acc", target * 100)
    for name, results in runs.items():
        figure(f"femnist_{name}_acc", results[0].final_accuracy * 100)
        reach = results[0].rounds_to(target)
        figure(f"femnist_{name}_rounds_to_target", -1 if reach is None else reach)
    (out / "femnist.md").write_text(
        f"FEMNIST sample, {model}, {base.rounds} rounds; target = FedAvg's final accuracy {target:.1%}\n\n"
        + comparison_table(runs, target)
    )
    plot_results(runs, out / "femnist.png", title=f"FEMNIST sample (51 writers), {model}")


def part_femnist_time(args: argparse.Namespace, out: Path) -> None:
    cfg = SimulationConfig(
        dataset="femnist",
        model="cnn_femnist",
        strategy="fedgsp",
        strategy_params={"kappa": 0.3, "beta": 2, "growth": "log", "alpha": 2.0},
        rounds=100,
        epochs=1,
        batch=5,
        lr=0.01,
        workers=args.workers,
        seed=args.seeds[0],
    )
    result = run(cfg, out, "femnist_fedgsp_cnn")
    figure("femnist_fedgsp_100r_s", result.seconds)
    figure("femnist_fedgsp_cnn_acc", result.final_accuracy * 100)


def part_shift(args: argparse.Namespace, out: Path) -> None:
    base = SimulationConfig(
        dataset="synthetic",
        dataset_params={"alpha": 1.0, "beta": 1.0, "users": 100},
        rounds=args.rounds or 300,
        epochs=10,
        batch=10,
        lr=0.01,
        workers=args.workers,
        strategy="flexcfl",
        shift_probability=0.05,
    )
    runs: dict[str, list[RunResult]] = {}
    for migrate in (True, False):
        label = "flexcfl_migration" if migrate else "flexcfl_static"
        for seed in args.seeds:
            cfg = base.with_overrides(
                seed=seed, strategy_params={"clients_per_round": 20, "n_groups": 5, "migrate": migrate}
            )
            runs.setdefault(label, []).append(run(cfg, out, f"shift_{label}"))
    with_m = np.mean([r.best_accuracy for r in runs["flexcfl_migration"]]) * 100
    without = np.mean([r.best_accuracy for r in runs["flexcfl_static"]]) * 100
    moved = np.mean([sum(rec.extra.get("migrated", 0) for rec in r.records) for r in runs["flexcfl_migration"]])
    figure("shift_migration_acc_delta", float(with_m - without))
    figure("shift_migrated_clients", float(moved))
    (out / "shift.md").write_text(comparison_table(runs))
    plot_results(runs, out / "shift.png", title="FlexCFL, Synthetic(1,1), swap-all shift p=0.05")


PARTS = {"synthetic": part_synthetic, "femnist": part_femnist, "femnist_time": part_femnist_time, "shift": part_shift}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", choices=sorted(PARTS), help="run only these parts")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, help="override the rounds of every part (quick checks)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--femnist-model", default="mlp_femnist")
    parser.add_argument("--out", default="runs/reproduce")
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for part in args.part or list(PARTS):
        start = time.perf_counter()
        PARTS[part](args, out)
        print(f"# part {part} took {time.perf_counter() - start:.0f} s", flush=True)
    (out / "README.txt").write_text(json.dumps(vars(args), default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
