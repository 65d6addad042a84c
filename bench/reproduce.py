"""Reproduce the papers' headline comparisons in simulation, and time them.

Parts (run all, or pick with ``--part``); each uses the paper's preset
(``covey presets``, ``server/simulation/presets.py``):

``synthetic``
    ``flexcfl-synthetic`` (FlexCFL Table 3: Synthetic(1,1), MCLR, 100 users, K = 20,
    E = 10, B = 10, lr 0.01, 5 groups, 300 rounds; FedProx μ = 1) for FedAvg, FedProx,
    IFCA, FeSEM and FlexCFL, and ``fedgroup-synthetic`` (E = 20) for FedGroup, over
    ``--seeds``. Maximum weighted test accuracy over rounds. Prints
    ``synthetic11_<strategy>_acc`` (mean over seeds, %), ``..._acc_spread`` and
    ``synthetic11_flexcfl_300r_s``.
``femnist``
    ``fedgsp-femnist`` with ``--femnist-model`` (MLP by default): FedAvg, FedProx,
    FedAdam, FedYogi (15 clients per round), NaiveGSP, NaiveGSP+ICG (static) and FedGSP.
    Prints ``femnist_<strategy>_acc`` (final, %) and ``femnist_<strategy>_rounds_to_target``
    (target: FedAvg's final accuracy).
``femnist_time``
    ``fedgsp-femnist`` as is (the CNN), 100 rounds: ``femnist_fedgsp_100r_s``,
    ``femnist_fedgsp_cnn_acc``.
``shift``
    ``flexcfl-synthetic`` with swap-all shift (p = 0.05), with and without migration:
    ``shift_migration_acc_delta``, ``shift_migrated_clients``, ``shift_shifted_clients``.
``hierarchical``
    FedAvg-IC and HierFAVG (τ1 = 1, τ2 = 5, scored on the global model) against FedAvg
    with τ = 5 local steps, Synthetic(1,1) with 30 nodes on 3 sites (RTT 2 ms inside a
    site, 40-80 ms across): ``hier_<strategy>_acc`` (final, %).

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

from server.settings import Source  # noqa: E402
from server.simulation.config import SimulationConfig  # noqa: E402
from server.simulation.presets import PRESETS  # noqa: E402
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


def _preset_run(preset_name: str, strategy: str, args: argparse.Namespace, **changes: object) -> SimulationConfig:
    cfg = PRESETS[preset_name].apply(SimulationConfig(), strategy)
    return cfg.with_overrides(Source.FLAG, "bench/reproduce.py", workers=args.workers, **changes)  # type: ignore[arg-type]


def part_synthetic(args: argparse.Namespace, out: Path) -> None:
    """FlexCFL Table 3's methods in its preset; FedGroup in its own (E = 20)."""
    runs: dict[str, list[RunResult]] = {}
    reported: dict[str, float] = {}
    for preset_name, names in (
        ("flexcfl-synthetic", ("fedavg", "fedprox", "ifca", "fesem", "flexcfl")),
        ("fedgroup-synthetic", ("fedgroup",)),
    ):
        reported.update({n: PRESETS[preset_name].reported[n] for n in names})
        for name in names:
            for seed in args.seeds:
                cfg = _preset_run(preset_name, name, args, seed=seed, rounds=args.rounds)
                runs.setdefault(name, []).append(run(cfg, out, f"synthetic11_{name}"))
    for name, results in runs.items():
        best = np.array([r.best_accuracy for r in results]) * 100
        figure(f"synthetic11_{name}_acc", float(best.mean()))
        figure(f"synthetic11_{name}_acc_spread", float(best.max() - best.min()))
    figure("synthetic11_flexcfl_300r_s", float(np.mean([r.seconds for r in runs["flexcfl"]])))
    (out / "synthetic11.md").write_text(comparison_table(runs, reported=reported))
    plot_results(runs, out / "synthetic11.png", title="Synthetic(1,1), MCLR, 100 users")


def part_femnist(args: argparse.Namespace, out: Path) -> None:
    """FedGSP's Table 1 methods in the fedgsp-femnist preset, with ``--femnist-model``."""
    model = args.femnist_model
    names = ("fedavg", "fedprox", "fedadam", "fedyogi", "naivegsp", "naivegsp_icg", "fedgsp")
    runs = {
        name: [
            run(
                _preset_run("fedgsp-femnist", name, args, model=model, seed=args.seeds[0], rounds=args.rounds),
                out,
                f"femnist_{name}",
            )
        ]
        for name in names
    }
    target = runs["fedavg"][0].final_accuracy
    figure("femnist_target_acc", target * 100)
    for name, results in runs.items():
        figure(f"femnist_{name}_acc", results[0].final_accuracy * 100)
        reach = results[0].rounds_to(target)
        figure(f"femnist_{name}_rounds_to_target", -1 if reach is None else reach)
    rounds = runs["fedavg"][0].config.rounds
    (out / "femnist.md").write_text(
        f"FEMNIST sample, {model}, {rounds} rounds; target = FedAvg's final accuracy {target:.1%}\n\n"
        + comparison_table(runs, target)
    )
    plot_results(runs, out / "femnist.png", title=f"FEMNIST sample (51 writers), {model}")


def part_femnist_time(args: argparse.Namespace, out: Path) -> None:
    """FedGSP in its preset (the LEAF CNN), 100 rounds: time and accuracy."""
    result = run(_preset_run("fedgsp-femnist", "fedgsp", args, seed=args.seeds[0]), out, "femnist_fedgsp_cnn")
    figure("femnist_fedgsp_100r_s", result.seconds)
    figure("femnist_fedgsp_cnn_acc", result.final_accuracy * 100)


def part_shift(args: argparse.Namespace, out: Path) -> None:
    """FlexCFL's preset with swap-all shift, with and without migration."""
    runs: dict[str, list[RunResult]] = {}
    for migrate in (True, False):
        label = "flexcfl_migration" if migrate else "flexcfl_static"
        for seed in args.seeds:
            cfg = _preset_run(
                "flexcfl-synthetic",
                "flexcfl",
                args,
                seed=seed,
                rounds=args.rounds,
                shift_probability=0.05,
                strategy_params={"migrate": migrate},
            )
            runs.setdefault(label, []).append(run(cfg, out, f"shift_{label}"))
    with_m = np.mean([r.best_accuracy for r in runs["flexcfl_migration"]]) * 100
    without = np.mean([r.best_accuracy for r in runs["flexcfl_static"]]) * 100
    moved = np.mean([sum(rec.extra.get("migrated", 0) for rec in r.records) for r in runs["flexcfl_migration"]])
    shifted = np.mean(
        [sum(rec.extra.get("shifted_clients", 0) for rec in r.records) for r in runs["flexcfl_migration"]]
    )
    figure("shift_migration_acc_delta", float(with_m - without))
    figure("shift_migrated_clients", float(moved))
    figure("shift_shifted_clients", float(shifted))
    (out / "shift.md").write_text(comparison_table(runs))
    plot_results(runs, out / "shift.png", title="FlexCFL, Synthetic(1,1), swap-all shift p=0.05")


def _sites(n: int, n_sites: int, rng: np.random.Generator) -> np.ndarray:
    """RTT (ms) between ``n`` nodes on ``n_sites`` sites: 2 ms inside a site, 40-80 ms across."""
    site = np.arange(n) % n_sites
    across = rng.uniform(40, 80, (n_sites, n_sites))
    across = (across + across.T) / 2
    rtt = np.where(site[:, None] == site[None, :], 2.0, across[site[:, None], site[None, :]])
    np.fill_diagonal(rtt, 0.0)
    return rtt


def part_hierarchical(args: argparse.Namespace, out: Path) -> None:
    """FedAvg-IC and HierFAVG (paper settings τ1 = 1, τ2 = 5; scored on the global model)
    against FedAvg with τ = 5 local steps, on Synthetic(1,1) with 30 nodes on 3 sites."""
    from server.paths import ensure_model
    from server.simulation import datasets
    from server.simulation.engine import Simulation
    from server.strategies import make_strategy
    from server.strategies.base import TrainConfig

    rounds = args.rounds or 500
    runs: dict[str, list[RunResult]] = {}
    for seed in args.seeds:
        fed = datasets.synthetic(1.0, 1.0, 30, seed=seed)
        rtt = _sites(30, 3, np.random.default_rng(seed))
        for name, strategy, n_rounds in (
            (
                "fedavg_tau5",
                make_strategy("fedavg", train=TrainConfig(1, 10, 0.01, 0.0, 5), clients_per_round=30),
                rounds // 5,
            ),
            ("hierfavg", make_strategy("hierfavg", train=TrainConfig(1, 10, 0.01), n_groups=3), rounds),
            ("fedavg_ic", make_strategy("fedavg_ic", train=TrainConfig(1, 10, 0.01), n_groups=3), rounds),
        ):
            start = time.perf_counter()
            sim = Simulation(
                strategy,
                fed,
                ensure_model("mclr_synthetic"),
                seed=seed,
                distance=rtt,
                workers=args.workers,
                federated_eval_every=1,
            )
            records = sim.run(n_rounds)
            cfg = SimulationConfig(strategy=name.split("_tau")[0], rounds=n_rounds, seed=seed)
            result = RunResult(name, cfg, records, time.perf_counter() - start, {})
            write_result(result, out, f"hier_{name}_seed{seed}", plot=False)
            runs.setdefault(name, []).append(result)
    for name, results in runs.items():
        figure(f"hier_{name}_acc", float(np.mean([r.final_accuracy for r in results]) * 100))
    (out / "hierarchical.md").write_text(comparison_table(runs))


PARTS = {
    "synthetic": part_synthetic,
    "femnist": part_femnist,
    "femnist_time": part_femnist_time,
    "shift": part_shift,
    "hierarchical": part_hierarchical,
}


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
