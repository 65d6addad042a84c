"""``covey edge run``: a site's edge on its gateway: the room's mosquitto, bridged to the
site's broker, and the edge host beside it (``server/edge/host.py``) that runs the
groups the coordinator hands it and relays the rest of its boards' messages."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from device.errors import ConfigError

if TYPE_CHECKING:
    from server.edge.host import EdgeHost

log = logging.getLogger("covey.edge")


def _cmd_edge_run(args: argparse.Namespace) -> int:
    if args.site:
        if args.broker or args.run or args.devices:
            raise ConfigError("--broker, --run and --devices are for an edge without a site; --site says them all")
        return _run_site_edge(args)
    missing = [flag for flag in ("broker", "run", "devices") if not getattr(args, flag)]
    if missing:
        raise ConfigError(f"give --site DIR, or --broker, --run and --devices (--{missing[0]} is missing)")
    return _run_plain_edge(args)


def _run_plain_edge(args: argparse.Namespace) -> int:
    """An edge whose broker already runs (a field test's room, or a mosquitto bridged by
    hand): anonymous, no TLS; the edge host only."""
    from device.cli import parse_broker
    from device.protocol.topics import check_id
    from server.edge.host import EdgeHost, EdgeSettings

    host_name, port = parse_broker(args.broker)
    devices = tuple(d.strip() for d in args.devices.split(",") if d.strip())
    for name in (args.edge, *devices):
        check_id(name, "--edge or --devices id")
    state_dir = Path(args.state_dir) if args.state_dir else None
    logging.getLogger("covey.edge").setLevel(logging.INFO)
    host = EdgeHost(EdgeSettings(args.run, args.edge, devices, host_name, port, username=None, state_dir=state_dir))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _serve(host, args.edge, f"on {host_name}:{port}", state_dir, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(_stopped_line(args.edge, host), flush=True)
    return 0


def _serve(host: EdgeHost, name: str, where: str, state_dir: Path | None, stop: threading.Event) -> None:
    """Connect, take up what the edge held before a restart, and serve until ``stop``;
    the host is closed however it ends."""
    from server.edge.host import board_list

    try:
        host.connect()
        host.resume()
        if host.resumed:
            print(f"edge {name}: took up {host.resumed} groups again from {state_dir}", flush=True)
        print(f"edge {name}: group managers for {board_list(host.devices)} {where}", flush=True)
        host.serve(stop)
    finally:
        with contextlib.suppress(Exception):
            host.close()


def _stopped_line(name: str, host: EdgeHost) -> str:
    return (
        f"edge {name} stopped: {host.groups_done} groups run here from {host.models_received} start models "
        f"received; {host.relayed} messages relayed, "
        f"{host.relayed_outputs} of them training outputs of groups run centrally"
    )


def _run_site_edge(args: argparse.Namespace) -> int:
    from device.mqtt import TlsFiles
    from server.broker import wait_for_port
    from server.edge.host import EdgeHost, EdgeSettings
    from server.site import load_site
    from server.site.edge import edge_dir
    from server.site.edge_files import load_edge
    from server.site.layout import CERT_FILE, KEY_FILE

    site = load_site(Path(args.site))
    edge = load_edge(site, args.edge)
    own = edge_dir(site.layout, edge.name) / "coordinator"
    password_file, ca = own / "password", own / "ca.crt"
    for path in (password_file, ca):
        if not path.is_file():
            raise ConfigError(
                f"{path} is missing; copy the site's edges/{edge.name}/ here from where `covey site add-edge` made it"
            )
    cert, key = own / CERT_FILE, own / KEY_FILE
    if site.spec.client_certs and not (cert.is_file() and key.is_file()):
        raise ConfigError(
            f"{cert} or {key} is missing and the site asks every client for a certificate; "
            f"copy the site's edges/{edge.name}/ here again from where `covey site add-edge` made it"
        )
    tls = TlsFiles(str(ca), str(cert), str(key)) if site.spec.client_certs else TlsFiles(str(ca))
    logging.getLogger("covey.edge").setLevel(logging.INFO)  # a line per group: what its operator reads
    state_dir = Path(args.state_dir) if args.state_dir else edge_dir(site.layout, edge.name) / "state"
    # the room's broker: `covey broker run --edge`, as a child that never outlives this
    # command (killed with it too: a restarted edge finds its port free)
    broker = subprocess.Popen(
        [sys.executable, "-m", "covey.cli", "broker", "run", "--site", args.site, "--edge", edge.name],
        env={**os.environ},
        preexec_fn=_stop_with_parent,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    host = EdgeHost(
        EdgeSettings(
            site.spec.run,
            edge.name,
            edge.devices,
            (edge.hosts or edge.ips)[0],  # a name or address its certificate carries
            edge.port,
            password=password_file.read_text().strip(),
            tls=tls,
            state_dir=state_dir,
        )
    )
    try:
        wait_for_port(edge.ips[0] if edge.ips else edge.hosts[0], edge.port, 30, broker)
        _serve(host, edge.name, f"on port {edge.port}", state_dir, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(15)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait(5)
    print(_stopped_line(edge.name, host), flush=True)
    return 0 if broker.returncode == 0 else 1


def _stop_with_parent() -> None:
    """In the broker's process before it runs: SIGTERM when this command's process ends,
    however it ends (Linux's PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    edge = sub.add_parser("edge", help="a site's edge: one room's broker and its group managers")
    edge_sub = edge.add_subparsers(dest="edge_command", required=True, metavar="ACTION")
    p = edge_sub.add_parser(
        "run",
        help="run the edge's mosquitto and its group managers in the foreground",
        description="On the room's gateway: starts the edge's mosquitto (bridged to the site's broker, as "
        "`covey broker run --edge NAME`) and the edge host, which runs the groups whose members all sit behind "
        "this edge and relays the rest of its boards' messages. Ctrl-C or SIGTERM stops both.",
    )
    p.add_argument("--site", metavar="DIR", help="the site folder (or a copy with edges/NAME/)")
    p.add_argument("--edge", required=True, metavar="NAME", help="the edge, as `covey site add-edge` named it")
    p.add_argument(
        "--broker",
        metavar="HOST:PORT",
        help="without --site: the edge's broker, already running and bridged (anonymous, no TLS: a field "
        "test's room); only the group managers start",
    )
    p.add_argument("--run", help="without --site: the run id the coordinator uses")
    p.add_argument("--devices", metavar="ID,ID,...", help="without --site: the boards behind this edge")
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the edge keeps the groups it runs, to take them up again after a restart "
        "(default: the site's edges/NAME/state)",
    )
    p.set_defaults(func=_cmd_edge_run)
