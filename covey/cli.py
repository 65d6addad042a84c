"""The ``covey`` command line."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from device.errors import CoveyError

if TYPE_CHECKING:
    from server.simulation.config import SimulationConfig


def _cmd_model_list(args: argparse.Namespace) -> int:
    from models.zoo import ZOO

    width = max(len(name) for name in ZOO)
    print(f"{'name':<{width}}  {'parameters':>11}  description")
    for name, arch in ZOO.items():
        print(f"{name:<{width}}  {arch.n_params:>11,}  {arch.description}")
    return 0


def _cmd_model_build(args: argparse.Namespace) -> int:
    from models.export import build
    from models.zoo import ZOO, get_architecture

    if args.all == bool(args.name):
        raise CoveyError("give either a model NAME or --all (see `covey model list`)")
    names = list(ZOO) if args.all else [args.name]
    for name in names:
        get_architecture(name)  # clear error before TensorFlow starts
    for name in names:
        model_path, manifest_path = build(name, Path(args.out), seed=args.seed)
        print(f"built {model_path} and {manifest_path}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from device.data import read_dataset
    from device.runtime import TFLiteModel

    model = TFLiteModel(args.model, num_threads=args.threads)
    data = read_dataset(args.data, user=args.user)
    print(f"{model.manifest.model}: {len(data)} samples, backend {model.backend.name} {model.backend.version}")
    result = model.train(
        data.x, data.y, epochs=args.epochs, batch_size=args.batch, lr=args.lr, mu=args.mu, seed=args.seed
    )
    print(f"trained {result.n_steps} steps, mean loss {result.mean_loss:.4f}")
    if args.test:
        test = read_dataset(args.test, user=args.user)
        ev = model.evaluate(test.x, test.y)
        print(f"test accuracy {ev.accuracy:.2%} (loss {ev.loss:.4f}, {ev.n_samples} samples)")
    return 0


def _cmd_strategies(args: argparse.Namespace) -> int:
    from server.strategies import STRATEGIES, strategy_parameters

    for name, cls in sorted(STRATEGIES.items()):
        print(f"{name:14s} {cls.summary}")
        params = sorted(strategy_parameters(name) - {"train"})
        if params:
            print(f"{'':14s}   --set: {', '.join(params)}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from covey.demo import run_demo

    return run_demo(
        model_name=args.model,
        rounds=args.rounds,
        devices=args.devices,
        out_dir=Path(args.out),
        data_dir=args.data_dir,
        broker=args.broker,
    )


def _cmd_server_run(args: argparse.Namespace) -> int:
    from device.cli import parse_broker
    from server.paths import ensure_model
    from server.serve import ServeOptions, prepare_serve, serve
    from server.simulation.config import parse_assignments

    host, port = parse_broker(args.broker) if args.broker else ("127.0.0.1", 0)
    if args.model_path:
        model_path = Path(args.model_path)
        if not model_path.exists():
            raise CoveyError(f"--model-path {model_path} does not exist")
    else:
        model_path = Path(f"{args.model}.tflite")  # replaced by the built (or cached) model below
    options = ServeOptions(
        run=args.run,
        host=host,
        port=port,
        strategy=args.strategy,
        strategy_params=parse_assignments(args.set),
        model_path=model_path,
        rounds=args.rounds,
        min_devices=args.min_devices,
        state_dir=Path(args.state_dir),
        eval_dir=Path(args.eval_data) if args.eval_data else None,
        epochs=args.epochs,
        batch=args.batch,
        lr=args.lr,
        handoff=args.handoff,
        deadline_s=args.deadline,
        seed=args.seed,
        register_timeout=args.register_timeout,
        resume=args.resume,
        advertise=args.advertise,
        federated_eval_every=args.federated_eval_every,
    )
    prepared = prepare_serve(options)  # every mistake surfaces before a broker starts or a file is written
    if not args.model_path:
        options.model_path = ensure_model(args.model)
    handle = None
    if not args.broker:
        from server.broker import start_mosquitto

        handle = start_mosquitto(port=args.port)
        options.host, options.port = handle.host, handle.port
        print(f"started mosquitto on {handle.host}:{handle.port}")
    try:
        coord = serve(prepared)
    finally:
        if handle is not None:
            handle.stop()
    print(
        f"{len(coord.records)} rounds; results in {Path(args.state_dir) / 'results.json'}, "
        f"{Path(args.state_dir) / 'results.csv'} and {Path(args.state_dir) / 'results.png'}"
    )
    return 0


def _cmd_device_run(args: argparse.Namespace) -> int:
    from device.cli import main as device_main

    return device_main(args.device_args)


def _simulation_config(args: argparse.Namespace, strategy: str | None = None) -> SimulationConfig:
    """Preset, then config file, then flags (later sources win), with their origins."""
    from server.settings import Source
    from server.simulation.config import SimulationConfig, load_config, parse_assignments
    from server.simulation.presets import preset

    cfg = SimulationConfig()
    chosen = strategy or getattr(args, "strategy", None)
    if args.preset:
        cfg = preset(args.preset).apply(cfg, chosen)
    if args.config:
        cfg = load_config(args.config, cfg)
    dataset_params = parse_assignments(args.data)
    if args.data_dir:
        dataset_params["data_dir"] = args.data_dir
    if args.dataset and args.dataset != cfg.dataset:
        from dataclasses import replace

        cfg = replace(cfg, dataset_params={})  # another data set's settings do not carry over
    return cfg.with_overrides(
        Source.FLAG,
        "command line",
        strategy=chosen,
        dataset=args.dataset,
        model=args.model,
        rounds=args.rounds,
        seed=getattr(args, "seed", None),
        workers=args.workers,
        epochs=args.epochs,
        batch=args.batch,
        lr=args.lr,
        mu=args.mu,
        shift_probability=args.shift,
        strategy_params=parse_assignments(args.set) or None,
        dataset_params=dataset_params or None,
        clients_per_round=args.clients_per_round,
    )


def _progress_bar(total: int, desc: str):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="round")

    def update(rec) -> None:  # type: ignore[no-untyped-def]
        bar.update(1)
        bar.set_postfix(acc=f"{rec.federated_accuracy:.3f}", loss=f"{rec.train_loss:.3f}")

    return bar, update


def _show_preset(args: argparse.Namespace) -> None:
    if args.preset:
        from server.simulation.presets import preset

        print(preset(args.preset).describe(), flush=True)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from server.simulation.run import prepare, run_simulation, write_result

    run = prepare(_simulation_config(args))  # every setting checked before anything runs
    cfg = run.config
    _show_preset(args)
    bar, update = _progress_bar(cfg.rounds, f"{cfg.strategy} on {cfg.dataset}")
    try:
        result = run_simulation(run, progress=update)
    finally:
        bar.close()
    paths = write_result(result, Path(args.out))
    line = (
        f"best accuracy {result.best_accuracy:.2%}, final {result.final_accuracy:.2%} "
        f"after {cfg.rounds} rounds in {result.seconds:.0f} s"
    )
    if args.preset:
        from server.simulation.presets import preset

        paper = preset(args.preset).reported.get(cfg.strategy)
        if paper is not None:
            line += f" (the paper reports {paper:.1f} %)"
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
    p.add_argument("--preset", help="a paper's setting (see `covey presets`); a config file and flags override it")
    p.add_argument("--config", help="TOML settings file (flags override it)")
    p.add_argument("--dataset", choices=["synthetic", "femnist", "mnist"], help="default: synthetic")
    p.add_argument(
        "--data",
        action="append",
        metavar="KEY=VALUE",
        help="data-set setting, e.g. alpha=1 beta=1 users=100 (synthetic), clients=100 scheme=dirichlet (mnist)",
    )
    p.add_argument("--data-dir", help="a LEAF folder with train/ and test/ (femnist)")
    p.add_argument("--model", help="zoo model (default: mclr_synthetic / cnn_femnist / mclr_mnist)")
    p.add_argument("--rounds", type=int, help="communication rounds")
    p.add_argument(
        "--clients-per-round",
        type=int,
        help="clients sampled per round, for the strategies that sample clients (FedGSP samples groups: κ)",
    )
    p.add_argument("--epochs", type=int, help="local epochs per client and round (default: the method's paper value)")
    p.add_argument("--batch", type=int, help="local mini-batch size (default: the method's paper value)")
    p.add_argument("--lr", type=float, help="local SGD learning rate (default: the method's paper value)")
    p.add_argument("--mu", type=float, help="FedProx proximal weight for local training (default: the method's)")
    p.add_argument("--workers", type=int, help="processes (default 1)")
    p.add_argument("--shift", type=float, help="distribution-shift swap probability per round")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="strategy parameter, e.g. n_groups=5 kappa=0.3 mu=0.01"
    )
    p.add_argument("--out", default="runs", help="output folder (default: runs)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="covey",
        description="Federated learning for heterogeneous edge devices.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    model = sub.add_parser("model", help="build and list the model zoo")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    p = model_sub.add_parser("list", help="show the zoo with parameter counts")
    p.set_defaults(func=_cmd_model_list)
    p = model_sub.add_parser("build", help="export zoo models to .tflite + manifest (needs TensorFlow)")
    p.add_argument("name", nargs="?", help="model name (see `covey model list`)")
    p.add_argument("--all", action="store_true", help="build every zoo model")
    p.add_argument("--out", default="build/zoo", help="output folder (default: build/zoo)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    p.set_defaults(func=_cmd_model_build)

    p = sub.add_parser("train", help="train a .tflite model on local data (what a device does)")
    p.add_argument("--model", required=True, help="a .tflite file with its .json manifest beside it")
    p.add_argument("--data", required=True, help="LEAF .json file or folder, .npz or .csv")
    p.add_argument("--user", help="LEAF user id when the file holds several")
    p.add_argument("--test", help="test data in the same format")
    p.add_argument("--epochs", type=int, default=1, help="epochs over the data (default 1)")
    p.add_argument("--batch", type=int, default=10, help="mini-batch size (default 10)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--mu", type=float, default=0.0, help="FedProx proximal weight (0: plain SGD)")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch shuffle")
    p.add_argument("--threads", type=int, default=None, help="interpreter threads (default: all CPUs)")
    p.set_defaults(func=_cmd_train)

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

    p = sub.add_parser("strategies", help="list the strategies")
    p.set_defaults(func=_cmd_strategies)

    p = sub.add_parser("presets", help="list each paper's setting that `simulate --preset` reproduces")
    p.set_defaults(func=_cmd_presets)

    p = sub.add_parser("demo", help="a broker, the coordinator and 8 device agents running FedGSP over MQTT")
    p.add_argument("--model", default="mlp_femnist", help="zoo model (default: mlp_femnist)")
    p.add_argument("--rounds", type=int, default=10, help="FedGSP rounds (default 10)")
    p.add_argument("--devices", type=int, default=8, help="device agent processes (default 8)")
    p.add_argument("--broker", help="HOST:PORT of an existing broker (default: an embedded amqtt broker)")
    p.add_argument("--out", default="runs/demo", help="where the plot, metrics and device logs go")
    p.add_argument("--data-dir", default=None, help="a LEAF FEMNIST folder with train/ and test/")
    p.set_defaults(func=_cmd_demo)

    server = sub.add_parser("server", help="the coordinator")
    server_sub = server.add_subparsers(dest="server_command", required=True, metavar="ACTION")
    p = server_sub.add_parser("run", help="run a strategy over MQTT devices")
    p.add_argument("--strategy", default="fedgsp", help="strategy name (see `covey strategies`)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="strategy parameter")
    p.add_argument("--model", default="mlp_femnist", help="zoo model, built if needed")
    p.add_argument("--model-path", help="a .tflite with its manifest (instead of --model)")
    p.add_argument("--broker", help="HOST:PORT of the broker (default: start mosquitto here)")
    p.add_argument("--port", type=int, help="port for the mosquitto this command starts")
    p.add_argument("--run", default="site", help="run id (topics live under covey/<run>/)")
    p.add_argument("--rounds", type=int, default=50, help="rounds to run (default 50)")
    p.add_argument("--min-devices", type=int, required=True, help="devices to wait for before round 1")
    p.add_argument(
        "--register-timeout", type=float, default=600.0, help="seconds to wait for --min-devices (default 600)"
    )
    p.add_argument("--eval-data", help="held-out LEAF data (a folder with test/, or a test folder)")
    p.add_argument("--epochs", type=int, help="local epochs per device and round (default: the method's paper value)")
    p.add_argument("--batch", type=int, help="local mini-batch size (default: the method's paper value)")
    p.add_argument("--lr", type=float, help="local SGD learning rate (default: the method's paper value)")
    p.add_argument(
        "--federated-eval-every",
        type=int,
        default=1,
        metavar="N",
        help="every N rounds, each device scores the model it would use on its own test set (default 1; 0: never)",
    )
    p.add_argument(
        "--handoff",
        choices=["auto", "direct", "relay", "mixed"],
        default="auto",
        help="chain hand-offs device to device, through the group manager, or per group from measured "
        "RTT (auto, the default)",
    )
    p.add_argument("--deadline", type=float, default=120.0, help="seconds a device may take per task")
    p.add_argument("--seed", type=int, default=0, help="seed of sampling, grouping and device shuffles")
    p.add_argument("--state-dir", default="runs/server", help="checkpoints, metrics and the plot")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--advertise", action="store_true", help="announce the run with zeroconf")
    p.set_defaults(func=_cmd_server_run)

    device = sub.add_parser("device", help="the device agent (same as covey-device)")
    device_sub = device.add_subparsers(dest="device_command", required=True, metavar="ACTION")
    p = device_sub.add_parser("run", help="run the agent; options as for covey-device", add_help=False)
    p.add_argument("device_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_device_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from device.cli import quiet_on_broken_pipe

    return quiet_on_broken_pipe(lambda: _main(argv))


def _parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """argparse, with a usage mistake as one line: argparse's own error line (it names
    the subcommand) and where the help is, without the usage block above it."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parser.parse_args(argv)
    except SystemExit as exc:
        lines = captured.getvalue().splitlines()
        if exc.code == 2 and lines and ": error: " in lines[-1]:
            prog = lines[-1].split(": error: ", 1)[0]
            print(f"{lines[-1]} (see `{prog} --help`)", file=sys.stderr)
        else:
            sys.stderr.write(captured.getvalue())
        raise


def _main(argv: Sequence[str] | None) -> int:
    rest = list(sys.argv[1:] if argv is None else argv)
    verbose = False
    while rest and rest[0] in ("-v", "--verbose"):
        verbose, rest = True, rest[1:]
    if rest[:2] == ["device", "run"]:
        # argparse's REMAINDER refuses a first argument that looks like a flag, so
        # `covey device run --data x` never reached the agent: hand it over as is.
        from device.cli import main as device_main

        return device_main(rest[2:] + (["-v"] if verbose else []))
    parser = build_parser()
    args = _parse_args(parser, argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except CoveyError as exc:
        print(f"covey: error: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:  # unknown zoo name
        print(f"covey: error: {exc.args[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("covey: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
