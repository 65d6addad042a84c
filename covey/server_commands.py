"""``covey server run``: the coordinator over MQTT, as a site runs it."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from covey.learning_flags import FLAG_DETAIL, add_learning_flags, from_preset_and_file, learning_overrides
from device.errors import CoveyError
from device.mqtt import TlsFiles, check_tls_files, read_password_file

if TYPE_CHECKING:
    from server.run_config import RunConfig

log = logging.getLogger("covey.server")
DEFAULT_STRATEGY = "fedgsp"  # the method covey was built around (docs/strategies.md)
DEFAULT_MODEL = "mlp_femnist"


@dataclass(frozen=True)
class Connection:
    """Where and how ``covey server run`` reaches its broker (checked before anything starts)."""

    host: str | None  # None: start mosquitto here
    port: int
    username: str | None
    password: str | None
    tls: TlsFiles | None
    run: str
    advertise_host: str | None
    allowed_devices: frozenset[str] | None  # the site's provisioned ids, or --allow-devices
    edges: dict[str, tuple[str, ...]]  # the site's edges and the devices behind each (server/edge/)


def read_device_list(path: str) -> frozenset[str]:
    """Device ids, one per line (blank lines and ``#`` comments ignored)."""
    from device.protocol.topics import check_id

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CoveyError(f"--allow-devices {path}: cannot read it ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise CoveyError(f"--allow-devices {path} is not UTF-8 text: give one device id per line") from exc
    ids = []
    for n, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            check_id(entry)
        except CoveyError as exc:
            raise CoveyError(f"--allow-devices {path} line {n}: {exc}") from exc
        ids.append(entry)
    if not ids:
        raise CoveyError(f"--allow-devices {path} names no device: give one device id per line")
    return frozenset(ids)


def parse_edges(given: list[str]) -> dict[str, tuple[str, ...]]:
    """``--edge NAME=ID,ID,...`` flags: each edge's boards (one edge per board)."""
    from device.protocol.topics import check_id

    edges: dict[str, tuple[str, ...]] = {}
    behind: dict[str, str] = {}
    for flag in given:
        name, _, ids = flag.partition("=")
        devices = tuple(d.strip() for d in ids.split(",") if d.strip())
        if not name or not devices:
            raise CoveyError(f"--edge {flag!r}: give NAME=ID,ID,... (the edge's name, then its boards)")
        for x in (name, *devices):
            try:
                check_id(x)
            except CoveyError as exc:
                raise CoveyError(f"--edge {flag!r}: {exc}") from exc
        if name in edges:
            raise CoveyError(f"--edge {name} is given twice; list all its boards in one")
        for d in devices:
            if d in behind:
                raise CoveyError(f"--edge {name}: {d} is behind the edge {behind[d]} already; a board has one")
            behind[d] = name
        edges[name] = devices
    return edges


def _connection(args: argparse.Namespace) -> Connection:
    """The broker, run and credentials from ``--site`` and the explicit flags (a flag wins).

    With ``--site DIR``: the run, the broker (the site's first host name on its TLS
    port) and the coordinator's credentials and CA from the site folder. A ``--broker``
    naming the site's plain loopback listener (``--loopback-port``) connects without TLS."""
    from device.cli import parse_broker
    from server.broker import is_loopback

    edges = parse_edges(args.edge or [])
    site = None
    if args.site:
        from server.site import load_site

        site = load_site(Path(args.site))
    given = [f for f in ("username", "password_file", "ca_certs", "certfile", "keyfile") if getattr(args, f)]
    if not args.broker and site is None:
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise CoveyError(
                f"{flag} is for a broker given with --broker or --site; the mosquitto this command starts "
                "takes anonymous clients (for a site with passwords and TLS see `covey site init`)"
            )
        allowed: frozenset[str] | None = read_device_list(args.allow_devices) if args.allow_devices else None
        return Connection(None, args.port or 0, None, None, None, args.run or "site", None, allowed, edges)
    if args.listen is not None:
        raise CoveyError("--listen is for the mosquitto this command starts; with --broker or --site it already runs")
    host, port = parse_broker(args.broker) if args.broker else parse_broker(site.spec.broker)  # type: ignore[union-attr]
    names = {"ca_certs": "--ca-certs", "certfile": "--certfile", "keyfile": "--keyfile"}
    files: dict[str, str | None] = {k: getattr(args, k) for k in names}
    username, password_file = args.username, args.password_file
    if site is not None:
        creds = site.coordinator()
        username = username or creds.username
        if password_file is None:
            password_file, names["password_file"] = str(creds.password_file), "the site's coordinator password"
        plain = port == site.spec.loopback_port and is_loopback(host)
        for key, path in (("ca_certs", creds.ca_certs), ("certfile", creds.certfile), ("keyfile", creds.keyfile)):
            if files[key] is None and path is not None and not plain:
                files[key], names[key] = str(path), f"the site's {key}"
    if password_file is not None and username is None:
        raise CoveyError("--password-file needs --username: the broker checks the password of a user")
    password = None
    if password_file is not None:
        password = read_password_file(password_file, names.get("password_file", "--password-file"))
    tls = None
    if any(files.values()):
        tls = TlsFiles(files["ca_certs"], files["certfile"], files["keyfile"])
        check_tls_files(tls, names)
    if args.allow_devices:
        allowed = read_device_list(args.allow_devices)
    else:  # a site admits the devices it provisioned; restart with --resume after `covey site add-device`
        allowed = frozenset(site.spec.devices) if site is not None else None
    run = args.run or (site.spec.run if site else "site")
    if site is not None:
        from server.site.edge import load_edges

        if edges:
            raise CoveyError("--edge is for a broker without a site; a --site lists its own edges")
        edges = {e.name: e.devices for e in load_edges(site.layout)}
    return Connection(host, port, username, password, tls, run, host, allowed, edges)


def _cmd_server_run(args: argparse.Namespace) -> int:
    from server.broker import advertised_host, check_listen, is_loopback
    from server.coordinator.config import CoordinatorConfig
    from server.paths import ensure_model
    from server.serve import ServeOptions, prepare_serve, serve

    conn = _connection(args)
    listen = check_listen(args.listen) if args.listen is not None else "127.0.0.1"
    learning = _learning(args)
    if args.model_path:
        model_path = Path(args.model_path)
        if not model_path.exists():
            raise CoveyError(f"--model-path {model_path} does not exist")
    else:
        model_path = Path(f"{learning.model}.tflite")  # replaced by the built (or cached) model below
    options = ServeOptions(
        CoordinatorConfig(
            conn.run,
            conn.host or "127.0.0.1",
            conn.port,
            Path(args.state_dir),
            handoff=args.handoff,
            deadline_s=args.deadline,
            username=conn.username,
            password=conn.password,
            tls=conn.tls,
            allowed_devices=conn.allowed_devices,
            edges=conn.edges,
            max_devices=args.max_devices,
            round_attempts=args.round_attempts,
            links_every=args.links_every,
            link_bandwidth_hz=args.link_bandwidth_mhz * 1e6,
        ),
        learning,
        model_path=model_path,
        min_devices=args.min_devices,
        eval_dir=Path(args.eval_data) if args.eval_data else None,
        register_timeout=args.register_timeout,
        resume=args.resume,
        advertise=args.advertise,
        advertise_host=conn.advertise_host or advertised_host(listen),
        dashboard=args.dashboard,
        dashboard_state=Path(args.dashboard_state) if args.dashboard_state else None,
    )
    prepared = prepare_serve(options)  # every mistake surfaces before a broker starts or a file is written
    if not args.model_path:
        options.model_path = ensure_model(learning.model or DEFAULT_MODEL)
    handle = None
    if conn.host is None:
        from server.broker import start_mosquitto

        handle = start_mosquitto(port=args.port, listen=listen)
        options.coordinator.host, options.coordinator.port = handle.host, handle.port
        print(f"started mosquitto on {listen}:{handle.port} (anonymous clients)")
    if args.advertise and options.advertise_host and is_loopback(options.advertise_host):
        log.warning(
            "advertising %s:%s, which only agents on this machine can reach; boards elsewhere need --listen "
            "0.0.0.0 (or a LAN address) or a --broker they can reach",
            options.advertise_host,
            options.coordinator.port,
        )
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


def _learning(args: argparse.Namespace) -> RunConfig:
    """The run's learning settings as ``covey simulate`` reads them (one path: a
    preset, then ``--config``, then flags), over this command's defaults (FedGSP on the
    FEMNIST MLP). A simulation-only setting in the preset or file (the data set, workers,
    a topology) is left out, and the run says which: each board trains on its own data."""
    from server.settings import Source
    from server.simulation.config import DEFAULT_MODEL as DATASET_MODEL
    from server.simulation.config import SimulationConfig

    base = SimulationConfig(strategy=DEFAULT_STRATEGY, dataset="femnist", model=DEFAULT_MODEL)
    cfg = from_preset_and_file(args, base, args.strategy)
    cfg = cfg.with_overrides(Source.FLAG, FLAG_DETAIL, strategy=args.strategy, **learning_overrides(args))
    if "dataset" in cfg.origins and "model" not in cfg.origins:
        # a file or preset that names a data set and no model simulates that data set's
        # model (cnn_femnist for femnist): the boards train the same one
        source, detail = cfg.origins["dataset"]
        cfg = cfg.with_overrides(source, detail, model=DATASET_MODEL[cfg.dataset])
    if args.model_path:
        cfg = cfg.with_overrides(Source.FLAG, args.model_path, model=Path(args.model_path).stem)
    left_out = cfg.only_simulated()
    if left_out:
        print(f"left out (simulation only; each board trains on its own data): {', '.join(left_out)}", flush=True)
    return cfg.learning()


def _cmd_report(args: argparse.Namespace) -> int:
    from server.dashboard.report import write_report

    path = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


def _cmd_links(args: argparse.Namespace) -> int:
    """Print the link matrices a run measured (its ``results.json``)."""
    import json

    from server.links import LinkMatrices

    path = Path(args.results)
    if path.is_dir():
        path = path / "results.json"
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise CoveyError(
            f"{path}: cannot read it ({exc.strerror or exc}); give a run's state dir or results.json"
        ) from exc
    except ValueError as exc:
        raise CoveyError(f"{path} is not a covey results file ({exc})") from exc
    raw = doc.get("links") if isinstance(doc, dict) else None
    if raw is None:
        raise CoveyError(f"{path} holds no link measurements (a run of covey server run, or simulate --topology)")
    try:
        matrices = LinkMatrices.from_dict(raw)
        table = matrices.table()
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CoveyError(f"{path}: its links are malformed ({type(exc).__name__}: {exc})") from exc
    print(f"links of {path} ({len(matrices.ids)} devices, B = {matrices.bandwidth_hz / 1e6:g} MHz)")
    print(table)
    print(f"entries by source: SNR {matrices.counts('snr')}, RTT {matrices.counts('rtt')}")
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
    return None if path is None else read_password_file(path, "--password-file")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    server = sub.add_parser("server", help="the coordinator")
    server_sub = server.add_subparsers(dest="server_command", required=True, metavar="ACTION")
    p = server_sub.add_parser("run", help="run a strategy over MQTT devices")
    p.add_argument("--strategy", help="strategy name (see `covey strategies`; default: the preset's, else fedgsp)")
    p.add_argument("--seed", type=int, help="seed of sampling, grouping and device shuffles (default 0)")
    add_learning_flags(
        p, model_help="zoo model, built if needed (default: the preset's, else mlp_femnist)", who="device"
    )
    p.add_argument("--model-path", help="a .tflite with its manifest (instead of --model)")
    p.add_argument("--broker", help="HOST:PORT of the broker (default: the --site's, else start mosquitto here)")
    p.add_argument("--port", type=int, help="port for the mosquitto this command starts")
    p.add_argument(
        "--listen",
        metavar="ADDR",
        help="address the mosquitto this command starts binds: 127.0.0.1 (default, this machine only), "
        "0.0.0.0 (every interface; boards are told this machine's LAN address) or a LAN address",
    )
    p.add_argument(
        "--site",
        metavar="DIR",
        help="a folder made by `covey site init`: its run, broker and the coordinator's credentials and CA "
        "(flags override each)",
    )
    p.add_argument(
        "--edge",
        action="append",
        metavar="NAME=ID,ID,...",
        help="an edge and the boards behind it (`covey edge run --broker`, a field test's rooms); repeat for "
        "each edge. A --site lists its own edges",
    )
    p.add_argument("--username", help="broker user name (with --broker)")
    p.add_argument("--password-file", help="file holding the broker password")
    p.add_argument("--ca-certs", help="CA certificate that signed the broker's (turns TLS on)")
    p.add_argument("--certfile", help="client certificate, if the broker asks for one (turns TLS on)")
    p.add_argument("--keyfile", help="the client certificate's unencrypted key")
    p.add_argument("--run", help="run id (topics live under covey/<run>/; default: the --site's, else 'site')")
    p.add_argument("--min-devices", type=int, required=True, help="devices to wait for before round 1")
    p.add_argument(
        "--register-timeout", type=float, default=600.0, help="seconds to wait for --min-devices (default 600)"
    )
    p.add_argument("--eval-data", help="held-out LEAF data (a folder with test/, or a test folder)")
    p.add_argument(
        "--handoff",
        choices=["auto", "direct", "relay", "mixed"],
        default="auto",
        help="chain hand-offs device to device, through the group manager, or per group from measured "
        "RTT (auto, the default; int8 and int4 runs relay, where hand-offs travel as deltas)",
    )
    p.add_argument("--deadline", type=float, default=120.0, help="seconds a device may take per task")
    p.add_argument("--state-dir", default="runs/server", help="checkpoints, metrics and the plot")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--advertise", action="store_true", help="announce the run with zeroconf")
    p.add_argument(
        "--allow-devices",
        metavar="FILE",
        help="the device ids that may register, one per line; any other is refused and counted "
        "(default with --site: the site's provisioned devices; otherwise anyone)",
    )
    p.add_argument("--max-devices", type=int, default=1000, help="devices admitted at most (default 1000)")
    p.add_argument(
        "--round-attempts",
        type=int,
        default=3,
        metavar="N",
        help="plans per round at most when every sampled device fails (default 3)",
    )
    p.add_argument(
        "--links-every",
        type=int,
        default=0,
        metavar="N",
        help="measure the links again every N rounds (default 0: once, before round 1; see docs/links.md)",
    )
    p.add_argument(
        "--link-bandwidth-mhz",
        type=float,
        default=20.0,
        metavar="B",
        help="Shannon bandwidth that turns measured goodput into an effective SNR (default 20, one Wi-Fi channel)",
    )
    p.add_argument(
        "--dashboard",
        metavar="[HOST:]PORT",
        help="serve a read-only live page of the run (host 127.0.0.1 unless given; any other address needs the "
        "token printed at start; docs/site-guide.md)",
    )
    p.add_argument(
        "--dashboard-state",
        metavar="FILE",
        help="keep the live page's state in FILE (JSON, replaced whole as the run goes), for a page another "
        "process serves: `covey field-test --dashboard` passes it",
    )
    p.set_defaults(func=_cmd_server_run)

    p = sub.add_parser(
        "links",
        help="print the SNR and RTT matrices a run measured, each entry marked measured or filled",
        description="Reads RESULTS (a run's state dir or its results.json, written by covey server run) and "
        "prints Γ (effective SNR, dB; diagonal: device to server) and the RTT matrix (ms).",
    )
    p.add_argument("results", metavar="RESULTS", help="a run's --state-dir, or its results.json")
    p.set_defaults(func=_cmd_links)

    p = sub.add_parser(
        "report",
        help="write a finished run's dashboard page as one HTML file (simulation or boards)",
        description="Reads RUN (a run's --state-dir or --out folder, or its results file) and writes the page "
        "`covey server run --dashboard` shows, as one file that opens with no server and no internet.",
    )
    p.add_argument("run_dir", metavar="RUN", help="a run's --state-dir or --out folder, or its results .json")
    p.add_argument("--out", metavar="FILE", help="where to write it (default: report.html beside the results)")
    p.set_defaults(func=_cmd_report)

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
