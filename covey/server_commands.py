"""``covey server run``: the coordinator over MQTT, as a site runs it."""

from __future__ import annotations

import argparse
from pathlib import Path

from device.errors import CoveyError


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


def _cmd_conformance(args: argparse.Namespace) -> int:
    from device.cli import parse_broker
    from server.conformance import run_conformance
    from server.paths import ensure_model

    host, port = parse_broker(args.broker)
    model = Path(args.model_path) if args.model_path else ensure_model(args.model)
    if not model.exists():
        raise CoveyError(f"--model-path {model} does not exist")
    print(f"waiting for device {args.device!r} to register on run {args.run!r} at {host}:{port} ...", flush=True)
    report = run_conformance(
        host,
        port,
        args.run,
        args.device,
        model,
        timeout=args.timeout,
        username=args.username,
        password=_password(args.password_file),
    )
    print(report.table())
    return 0 if not report.failed else 1


def _password(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise CoveyError(f"--password-file {path}: {exc.strerror or exc}") from None


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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

    p = sub.add_parser(
        "conformance",
        help="drive one device (covey's or a third party's) through the protocol and report what conforms",
        description="Plays the server of RUN: publishes the model, waits for the device to register, sends every "
        "request kind and bad input, and checks each rule of docs/protocol.md. Exit status 0 when every rule "
        "holds, 1 otherwise. Start the device with --broker HOST:PORT --run RUN --id ID.",
    )
    p.add_argument("--broker", required=True, help="HOST:PORT of the broker the device uses")
    p.add_argument("--run", default="conformance", help="run id for the test (default: conformance)")
    p.add_argument("--device", required=True, help="the device id to test")
    p.add_argument("--model", default="mlp_femnist", help="zoo model matching the device's data (default mlp_femnist)")
    p.add_argument("--model-path", help="a .tflite with its manifest (instead of --model)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each reply (default 60)")
    p.add_argument("--username", help="broker user name")
    p.add_argument("--password-file", help="file holding the broker password")
    p.set_defaults(func=_cmd_conformance)
