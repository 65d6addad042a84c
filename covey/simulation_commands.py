"""``covey simulate``, ``covey compare`` and ``covey presets``: strategies over virtual devices.

Settings come from a preset, then a config file, then flags (later ones win), and
everything is checked (:func:`server.simulation.run.prepare`) before the first round
runs or the first file is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from covey.learning_flags import FLAG_DETAIL, add_learning_flags, from_preset_and_file, learning_overrides
from device.errors import ConfigError, CoveyError
from server.simulation.channel import CHANNELS
from server.simulation.threads import WORKER_KINDS

if TYPE_CHECKING:
    from server.simulation.config import SimulationConfig


def _simulation_config(args: argparse.Namespace, strategy: str | None = None) -> SimulationConfig:
    """Preset, then config file, then flags (later sources win), with their origins."""
    from server.settings import Source
    from server.simulation.config import SimulationConfig, parse_assignments

    chosen = strategy or getattr(args, "strategy", None)
    cfg = from_preset_and_file(args, SimulationConfig(), chosen)
    dataset_params = parse_assignments(args.data)
    if args.data_dir:
        dataset_params["data_dir"] = args.data_dir
    if args.dataset and args.dataset != cfg.dataset:
        from dataclasses import replace

        cfg = replace(cfg, dataset_params={})  # another data set's settings do not carry over
    return cfg.with_overrides(
        Source.FLAG,
        FLAG_DETAIL,
        strategy=chosen,
        dataset=args.dataset,
        workers=args.workers,
        worker_kind=args.worker_kind,
        shift_probability=args.shift,
        dataset_params=dataset_params or None,
        topology=args.topology,
        link_grouping=False if args.no_link_grouping else None,
        channel=args.channel,
        **learning_overrides(args),
    )


def _progress_bar(total: int, desc: str):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="round")

    scored = ["—"]  # the last federated accuracy (rounds between --federated-eval-every have none)

    def update(rec) -> None:  # type: ignore[no-untyped-def]
        bar.update(1)
        if np.isfinite(rec.federated_accuracy):
            scored[0] = f"{rec.federated_accuracy:.3f}"
        bar.set_postfix(acc=scored[0], loss=f"{rec.train_loss:.3f}")

    return bar, update


def _show_preset(args: argparse.Namespace) -> None:
    if args.preset:
        from server.simulation.presets import preset

        print(preset(args.preset).describe(), flush=True)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from server.simulation.run import build_federation, check_clients, prepare, run_simulation, write_result

    run = prepare(_simulation_config(args))  # every setting checked before anything runs
    cfg = run.config
    _show_preset(args)
    federation = build_federation(cfg)
    check_clients(run, federation)  # enough clients for the strategy, as many as the topology places
    bar, update = _progress_bar(cfg.rounds, f"{cfg.strategy} on {cfg.dataset}")
    try:
        result = run_simulation(run, progress=update, federation=federation)
    finally:
        bar.close()
    paths = write_result(result, Path(args.out))
    line = (
        f"best accuracy {result.best_accuracy:.2%}, final {result.final_accuracy:.2%} "
        if np.isfinite(result.final_accuracy)
        else "no accuracy measured (--federated-eval-every 0) "
    ) + f"after {cfg.rounds} rounds in {result.seconds:.0f} s"
    if args.preset:
        from server.simulation.presets import preset

        paper = preset(args.preset).reported.get(cfg.strategy)
        if paper is not None:
            line += f" (the paper reports {paper:.1f} %)"
    if result.links is not None:
        line += f"; modelled time on {cfg.topology}: {result.summary['modelled_s']:.1f} s"
    if "wire_bytes_per_round" in result.summary:
        sent, radio = (float(result.summary[k]) / 1e6 for k in ("wire_bytes_per_round", "wire_radio_bytes_per_round"))  # type: ignore[arg-type]
        line += f"; {cfg.codec} models: {sent:.2f} MB sent per round ({radio:.2f} MB on the devices' links)"
    print(line)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def parse_names(text: str) -> list[str]:
    """``--strategies a,b``: known strategy names, at least one."""
    from server.settings import strategy_class

    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise CoveyError("--strategies needs at least one strategy name, e.g. --strategies fedavg,fedgsp")
    for name in names:
        strategy_class(name)
    return names


def _cmd_compare(args: argparse.Namespace) -> int:
    from server.simulation.run import RunResult, comparison_table, plot_results, prepare, run_simulation, write_result

    names = parse_names(args.strategies)
    seeds = parse_seeds(args.seeds)
    out = Path(args.out)
    # every run is prepared (and so checked) before the first one starts or any file is written
    runs_to_do = [prepare(_simulation_config(args, name).with_overrides(seed=seed)) for name in names for seed in seeds]
    if runs_to_do[0].config.federated_eval_every == 0:
        raise ConfigError("compare ranks runs by their accuracy: federated_eval_every must be 1 or more here")
    _show_preset(args)
    runs: dict[str, list[RunResult]] = {}
    for run in runs_to_do:
        cfg = run.config
        bar, update = _progress_bar(cfg.rounds, f"{cfg.strategy} seed {cfg.seed}")
        try:
            result = run_simulation(run, progress=update)
        finally:
            bar.close()
        write_result(result, out)
        runs.setdefault(cfg.strategy, []).append(result)
    base = runs_to_do[0].config
    target = args.target
    if target is None and "fedavg" in runs:
        target = float(np.mean([r.final_accuracy for r in runs["fedavg"]]))
    reported = {}
    if args.preset:
        from server.simulation.presets import preset

        reported = dict(preset(args.preset).reported)
    table = comparison_table(runs, target, reported)
    from device.state import atomic_write

    atomic_write(
        out / "comparison.md",
        (
            f"{base.dataset}, {base.model_name}, {base.rounds} rounds, seeds {seeds}"
            + (f", target accuracy {target:.1%}" if target is not None else "")
            + "\n\n"
            + table
        ).encode(),
    )
    plot_results(runs, out / "comparison.png", title=f"{base.dataset} ({base.model_name})")
    print(table)
    print(f"wrote {out / 'comparison.md'} and {out / 'comparison.png'}")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from server.simulation.presets import PRESETS

    if args.check:
        from server.simulation.preset_check import check_presets

        unlisted = check_presets()
        for u in unlisted:
            print(u)
        if unlisted:
            print(f"{len(unlisted)} departure(s) from the papers are not listed in their presets")
            return 1
        print(f"every preset ({len(PRESETS)}) lists each of its runs' departures from its paper")
        return 0
    for p in PRESETS.values():
        print(p.describe())
        print()
    print("run one: covey simulate --preset NAME [--strategy S]")
    print("several: covey compare --preset NAME --strategies A,B,...")
    return 0


def parse_seeds(text: str) -> list[int]:
    """``compare --seeds``: comma-separated integers >= 0, each once."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit():
            rule = ">= 0" if part.lstrip("-").isdigit() else "comma-separated integers"
            raise CoveyError(f"--seeds must be {rule}, e.g. --seeds 0,1,2; got {part!r} in {text!r}")
        if int(part) in seeds:
            raise CoveyError(f"--seeds names seed {int(part)} twice in {text!r}; give each seed once")
        seeds.append(int(part))
    if not seeds:
        raise CoveyError(f"--seeds {text!r} holds no seed; give comma-separated integers, e.g. --seeds 0,1,2")
    return seeds


def _add_simulation_flags(p: argparse.ArgumentParser) -> None:
    add_learning_flags(p, model_help="zoo model (default: mclr_synthetic / cnn_femnist / mclr_mnist)")
    p.add_argument("--dataset", choices=["synthetic", "femnist", "mnist"], help="default: synthetic")
    p.add_argument(
        "--data",
        action="append",
        metavar="KEY=VALUE",
        help="data-set setting, e.g. alpha=1 beta=1 users=100 (synthetic), clients=100 scheme=dirichlet (mnist)",
    )
    p.add_argument("--data-dir", help="a LEAF folder with train/ and test/ (femnist)")
    p.add_argument(
        "--workers",
        type=int,
        help="clients trained side by side, each on a one-thread interpreter (default: one per core, at most 4; "
        "1: one interpreter on two threads)",
    )
    p.add_argument(
        "--worker-kind",
        choices=WORKER_KINDS,
        help="where workers run when there are several: threads of this process (default) or forked processes",
    )
    p.add_argument("--shift", type=float, help="distribution-shift swap probability per round")
    p.add_argument(
        "--topology",
        metavar="FILE",
        help="network topology TOML (sites, links): strategies get its SNR and RTT matrices and each round "
        "its modelled time (examples/topologies/, docs/links.md)",
    )
    p.add_argument(
        "--no-link-grouping",
        action="store_true",
        help="with --topology: strategies do not get its matrices (DSC, FedAvg-IC group on data alone); "
        "the links still time each round",
    )
    p.add_argument(
        "--channel",
        choices=CHANNELS,
        help="with --topology: 'awgn' corrupts every update on its way in with noise of power signal / SNR "
        "over the topology's links (DSC's channel model, docs/links.md); default none",
    )
    p.add_argument("--out", default="runs", help="output folder (default: runs)")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="run one strategy over virtual devices (no broker)")
    p.add_argument("--strategy", help="strategy name (see `covey strategies`)")
    p.add_argument("--seed", type=int)
    _add_simulation_flags(p)
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("compare", help="run several strategies on the same data and seeds; table + plot")
    p.add_argument("--strategies", required=True, help="comma-separated names, e.g. fedavg,fedgsp")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--target", type=float, help="accuracy for 'rounds to target' (default: FedAvg's final)")
    _add_simulation_flags(p)
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("presets", help="list each paper's setting that `simulate --preset` reproduces")
    p.add_argument(
        "--check",
        action="store_true",
        help="check that every setting a preset's runs take from covey or the authors' code is a listed "
        "departure (exit 1 if not)",
    )
    p.set_defaults(func=_cmd_presets)
