"""``covey field-test TOPOLOGY --strategy NAME``: a field test rehearsed on this machine.

Builds the topology's network out of Linux network namespaces (server/field/), runs
the real broker, coordinator and agents on it, and reports accuracy against wall time
and the links covey measured next to the topology's (docs/links.md, "Field tests").
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from covey.learning_flags import add_codec_flag
from device.errors import ConfigError

DEFAULT_MODEL = "mlp_femnist"


DASHBOARD_STATE = "dashboard-state.json"  # in the run's state folder


@contextmanager
def field_dashboard(address: str | None, state_dir: Path, title: str) -> Iterator[None]:
    """With ``--dashboard``: the page, served from this machine. The coordinator runs in
    a namespace of its own and keeps the page's state in ``state_dir`` (its
    ``--dashboard-state``, :func:`_server_args`); the page follows that file."""
    if address is None:
        yield
        return
    from server.dashboard.feed import StateFileFeed
    from server.dashboard.live import DashboardServer, LiveView, keep_url, parse_address

    view = LiveView()
    server = DashboardServer(view, parse_address(address), title).start()
    try:
        (state_dir / DASHBOARD_STATE).unlink(missing_ok=True)  # an earlier test's, in the same folder
        feed = StateFileFeed(view, state_dir / DASHBOARD_STATE).start()
        print(f"dashboard: {server.url}", flush=True)
        keep_url(state_dir / "dashboard-url", server.url)  # as `covey server run` keeps it
        try:
            yield
        finally:
            feed.finish()
    finally:
        server.close()


def _server_args(args: argparse.Namespace, n_devices: int, state_dir: Path) -> list[str]:
    """What ``covey server run`` gets besides the lab's broker, run, devices and data
    (with ``--dashboard``, where to keep the page's state).
    Every device is asked each round where the strategy takes ``clients_per_round``,
    unless ``--set`` says otherwise: a field test is about the whole site's links (FedGSP
    has no such setting: a fraction κ of its groups trains each round)."""
    from server.simulation.config import parse_assignments
    from server.strategies import strategy_parameters

    out = ["--strategy", args.strategy, "--model", args.model, "--rounds", str(args.rounds)]
    out += ["--deadline", str(args.deadline), "--register-timeout", str(args.register_timeout)]
    out += ["--federated-eval-every", "0", "--link-bandwidth-mhz", str(args.link_bandwidth_mhz)]
    if args.dashboard is not None:
        out += ["--dashboard-state", str(state_dir / DASHBOARD_STATE)]
    for flag in ("epochs", "batch", "lr", "lr_decay", "codec", "handoff"):
        value = getattr(args, flag)
        if value is not None:
            out += [f"--{flag.replace('_', '-')}", str(value)]
    for assignment in args.set or []:
        out += ["--set", assignment]
    given = parse_assignments(args.set)
    if "clients_per_round" in strategy_parameters(args.strategy) and "clients_per_round" not in given:
        out += ["--set", f"clients_per_round={n_devices}"]
    return out


def _check(args: argparse.Namespace) -> None:
    from server.simulation.config import parse_assignments
    from server.strategies import strategy_parameters

    if args.rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {args.rounds}")
    if args.dashboard is not None:
        from server.dashboard.live import parse_address

        parse_address(args.dashboard)  # one line before any namespace is made
    for flag, value in (
        ("timeout", args.timeout),
        ("deadline", args.deadline),
        ("lr", args.lr),
        ("lr-decay", args.lr_decay),
        ("link-bandwidth-mhz", args.link_bandwidth_mhz),
        ("register-timeout", args.register_timeout),
    ):
        if value is not None and not value > 0:
            raise ConfigError(f"--{flag} must be > 0, got {value:g}")
    if args.lr_decay is not None and args.lr_decay > 1:
        raise ConfigError(f"--lr-decay must be in (0, 1] (1: no decay), got {args.lr_decay:g}")
    for flag, count in (("epochs", args.epochs), ("batch", args.batch)):
        if count is not None and count < 1:
            raise ConfigError(f"--{flag} must be >= 1, got {count}")
    if args.target is not None and not 0 < args.target <= 100:
        raise ConfigError(f"--target is an accuracy in percent (0 to 100], got {args.target:g}")
    accepted = strategy_parameters(args.strategy)  # an unknown strategy names the known ones
    unknown = sorted(set(parse_assignments(args.set)) - accepted)
    if unknown:
        raise ConfigError(f"--set {unknown[0]}: {args.strategy} takes {', '.join(sorted(accepted))}")


def _class_counts(root: Path, writers: dict[str, str]) -> dict[str, object]:
    import numpy as np

    from device.data import class_counts, read_leaf

    train = read_leaf(root / "train")
    n_classes = 1 + max(int(np.max(train[w].y)) for w in writers.values() if len(train[w].y))
    return {d: class_counts(train[w].y, n_classes) for d, w in writers.items()}


def _cmd_field_test(args: argparse.Namespace) -> int:
    from server.field.edges import EdgeMode
    from server.field.fieldtest import namespace_prefix, plan_field_test, run_field_test
    from server.field.report import build_report, format_report, plot_field
    from server.paths import ensure_model, femnist_dir

    _check(args)
    topology_path = Path(args.topology)
    out = Path(args.out) if args.out else Path("runs") / "field" / f"{topology_path.stem}-{args.strategy}"
    root = Path(args.data_dir) if args.data_dir else femnist_dir()
    mode = EdgeMode.CENTRAL if args.central else EdgeMode.EDGE
    plan = plan_field_test(topology_path, root, out, [], seed=args.seed, timeout_s=args.timeout, edge_mode=mode)
    edge_sites = plan.topology.edge_sites
    if args.central and not edge_sites:
        raise ConfigError(f"--central is for a topology with [[edge]] sites; {topology_path} has none")
    plan = replace(plan, server_args=tuple(_server_args(args, len(plan.devices), plan.state_dir)))
    print(f"building or loading the {args.model} model ...", flush=True)
    ensure_model(args.model)
    sites = ", ".join(
        f"{s.name}: {s.devices} x {s.link.bandwidth_mbps:g} Mbit/s, {s.link.latency_ms:g} ms"
        + (f" ±{s.link.jitter_ms:g}" if s.link.jitter_ms else "")
        + (f", {100 * s.link.loss:g} % loss" if s.link.loss else "")
        + (
            f", {'an edge' if mode is EdgeMode.EDGE else 'a gateway'} on an uplink of "
            f"{s.uplink.bandwidth_mbps:g} Mbit/s, {s.uplink.latency_ms:g} ms"
            if s.uplink is not None
            else ""
        )
        for s in plan.topology.sites
    )
    print(f"field test of {args.strategy} on {topology_path} ({sites}); logs in {plan.log_dir}", flush=True)
    print(f"network namespaces {namespace_prefix(plan)}* (removed at the end)", flush=True)
    start = time.perf_counter()
    signal.signal(signal.SIGTERM, _stop)  # the lab's namespaces and processes go also then
    with field_dashboard(args.dashboard, plan.state_dir, f"covey field test: {args.strategy}"):
        run = run_field_test(plan)
    doc = json.loads((plan.state_dir / "results.json").read_text())
    site_of = {d.device_id: d.site for d in plan.devices}
    counts = _class_counts(root, {d.device_id: d.writer for d in plan.devices})
    report = build_report(
        doc,
        site_of,
        strategy=args.strategy,
        bandwidth_hz=args.link_bandwidth_mhz * 1e6,
        class_counts=counts,  # type: ignore[arg-type]
        target=None if args.target is None else args.target / 100,
        link_bytes=run.traffic.as_dict(),
        via_edges=bool(edge_sites) and mode is EdgeMode.EDGE,
    )
    if edge_sites:
        report.edges, report.groups_at_edges = mode.value, run.groups_at_edges
    report.process_wall_s = time.perf_counter() - start
    (out / "field.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    title = f"{args.strategy} on {topology_path.name}"
    plot_field({args.strategy: report}, out / "field.png", title=title, target=report.target)
    print(format_report(report, out))
    return 0


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the lab's context manager, which removes it


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "field-test",
        help="rehearse a field test: the topology in network namespaces, real broker, coordinator and agents",
        description="Builds TOPOLOGY's network on this machine (one network namespace per device; bandwidth "
        "with tbf, latency, jitter and loss with a relay), runs the broker, `covey server run` and one agent "
        "per device on it, and reports accuracy against wall time and the measured links next to the "
        "topology's. Needs root and mosquitto.",
    )
    p.add_argument("topology", metavar="TOPOLOGY", help="a topology TOML (see examples/topologies/)")
    p.add_argument("--strategy", required=True, help="strategy name (see `covey strategies`)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="strategy parameter")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"zoo model (default {DEFAULT_MODEL})")
    p.add_argument("--rounds", type=int, default=10, help="rounds to run (default 10)")
    p.add_argument("--epochs", type=int, help="local epochs (default: the method's paper value)")
    p.add_argument("--batch", type=int, help="local mini-batch size (default: the method's paper value)")
    p.add_argument("--lr", type=float, help="local SGD learning rate (default: the method's paper value)")
    p.add_argument(
        "--lr-decay", type=float, metavar="D", help="the learning rate of round r is lr x D^(r-1) (default: paper's)"
    )
    add_codec_flag(p)
    p.add_argument(
        "--handoff",
        choices=("auto", "direct", "relay"),
        help="chain hand-offs, as `covey server run --handoff` (default auto: relayed and screened; direct: "
        "device to device, timed on the peers' own links)",
    )
    p.add_argument(
        "--central",
        action="store_true",
        help="with [[edge]] sites: their gateways only forward to the central broker (the same links, no edge "
        "broker or groups there): what the edges save, side by side",
    )
    p.add_argument("--target", type=float, help="accuracy (%%) whose time-to-accuracy the report gives")
    p.add_argument("--data-dir", help="a LEAF folder with train/ and test/ (default: the bundled FEMNIST sample)")
    p.add_argument("--out", help="report, plot, run state and logs (default runs/field/<topology>-<strategy>)")
    p.add_argument("--seed", type=int, default=0, help="seed of the run and the relays (default 0)")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds a device may take per task (default 300)")
    p.add_argument(
        "--register-timeout", type=float, default=300.0, help="seconds to wait for every agent (default 300)"
    )
    p.add_argument(
        "--link-bandwidth-mhz", type=float, default=20.0, help="Shannon's B for SNRs from goodput (default 20)"
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the test is stopped (default 3600)")
    p.add_argument(
        "--dashboard",
        metavar="[HOST:]PORT",
        help="serve a read-only live page of the test on this machine (127.0.0.1 unless given; any other address "
        "needs the printed token), following the run's results round by round",
    )
    p.set_defaults(func=_cmd_field_test)
