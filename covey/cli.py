"""The ``covey`` command line."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence
from pathlib import Path

from covey import edge_commands, field_commands, server_commands, simulation_commands, site_commands
from covey.logs import setup_logging
from covey.simulation_commands import parse_seeds
from device.errors import CoveyError

__all__ = ["build_parser", "main", "parse_seeds"]

DEVICE_RUN = "covey device run"  # the agent's name in its error lines when covey starts it


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
    from server.strategies import strategy_class, strategy_names, strategy_parameters

    for name in strategy_names():
        print(f"{name:14s} {strategy_class(name).summary}")
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


def _cmd_device_run(args: argparse.Namespace) -> int:
    from device.cli import main as device_main

    return device_main(args.device_args, prog=DEVICE_RUN)


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

    p = sub.add_parser("strategies", help="list the strategies")
    p.set_defaults(func=_cmd_strategies)

    simulation_commands.add_parsers(sub)

    p = sub.add_parser("demo", help="a broker, the coordinator and 8 device agents running FedGSP over MQTT")
    p.add_argument("--model", default="mlp_femnist", help="zoo model (default: mlp_femnist)")
    p.add_argument("--rounds", type=int, default=10, help="FedGSP rounds (default 10)")
    p.add_argument("--devices", type=int, default=8, help="device agent processes (default 8)")
    p.add_argument("--broker", help="HOST:PORT of an existing broker (default: an embedded amqtt broker)")
    p.add_argument("--out", default="runs/demo", help="where the plot, metrics and device logs go")
    p.add_argument("--data-dir", default=None, help="a LEAF FEMNIST folder with train/ and test/")
    p.set_defaults(func=_cmd_demo)

    server_commands.add_parsers(sub)
    site_commands.add_parsers(sub)
    edge_commands.add_parsers(sub)
    field_commands.add_parsers(sub)

    device = sub.add_parser("device", help="the device agent (same as covey-device)")
    device_sub = device.add_subparsers(dest="device_command", required=True, metavar="ACTION")
    p = device_sub.add_parser("run", help="run the agent; options as for covey-device", add_help=False)
    p.add_argument("device_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_device_run)
    _name_commands(parser)
    return parser


def _name_commands(parser: argparse.ArgumentParser) -> None:
    """Set ``command_name`` (``covey server run``) in the namespace of every command.

    Every mistake a user can fix is one line on stderr that starts with the command's
    full name, ``covey server run: error: ...``, and the command exits with status 2:
    argparse's own errors name the subcommand that way, and so do the errors raised
    while a command runs (:func:`_main`). A subcommand's default overrides its parent's.
    """
    parser.set_defaults(command_name=parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _name_commands(sub)


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

        return device_main(rest[2:] + (["-v"] if verbose else []), prog=DEVICE_RUN)
    parser = build_parser()
    args = _parse_args(parser, argv)
    setup_logging(args.verbose)  # records go through tqdm, so none lands on a progress bar's line
    name = args.command_name  # e.g. "covey server run": every line below starts with it
    try:
        return int(args.func(args))
    except CoveyError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:  # unknown zoo name
        print(f"{name}: error: {exc.args[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
