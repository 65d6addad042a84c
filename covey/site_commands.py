"""``covey site init``, ``add-device``, ``sample-data`` and ``covey broker run --site``.

A site is one folder (:mod:`server.site`): the broker's TLS and identities, the
coordinator's credentials, and a bundle per board. These commands make it, add a
board to it, and run its mosquitto in the foreground (for machines without systemd;
``firmware_scripts/broker-setup.sh`` installs it as the system service instead).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from device.errors import ConfigError

if TYPE_CHECKING:
    from server.site.edge import EdgeSpec


def _cmd_site_init(args: argparse.Namespace) -> int:
    import os

    from server.site import SiteSpec, init_site

    if args.system and os.geteuid() != 0:
        raise ConfigError("--system sets the site up for the system's mosquitto service: run it as root (sudo)")
    spec = SiteSpec(
        run=args.run,
        hosts=tuple(args.host or ()),
        ips=tuple(args.ip or ()),
        devices=tuple(args.devices or ()),
        port=args.port,
        loopback_port=args.loopback_port,
        client_certs=args.client_certs,
        system=args.system,
        broker_memory_mb=args.broker_memory_mb,
    )
    edge = _edge_of_init(args, spec.devices)  # checked before anything is written
    site = init_site(Path(args.dir), spec, force=args.force)
    s, layout = site.spec, site.layout
    names = ", ".join((*s.hosts, *s.ips))
    plain = f"; plain MQTT on 127.0.0.1:{s.loopback_port}" if s.loopback_port else ""
    print(f"made the covey site {s.run!r} in {layout.root}")
    print(f"  broker:      {layout.broker_conf} (TLS on port {s.port} for {names}{plain})")
    print(f"  coordinator: {layout.coordinator_dir} (user coordinator)")
    print(f"  boards:      {layout.devices_dir}/<ID>/, one bundle per board: {', '.join(s.devices)}")
    if edge is not None:
        from server.site.edge_files import add_edge

        folder = add_edge(layout.root, edge)
        print(f"  edge:        {folder} (its boards dial it: {', '.join(edge.devices)}; bridged as edge.{edge.name})")
    print(f"next: covey broker run --site {layout.root}   (or firmware_scripts/broker-setup.sh for systemd)")
    if edge is not None:
        print(f"      and on the edge's host: covey edge run --site {layout.root} --edge {edge.name}")
    return 0


def _edge_of_init(args: argparse.Namespace, devices: tuple[str, ...]) -> EdgeSpec | None:
    """``covey site init --edge NAME --edge-devices ...``: the edge ``covey site add-edge``
    would add, checked against the new site's devices; None without ``--edge``."""
    from server.site.edge import EdgeSpec, check_edge
    from server.site.spec import check_device_id, check_host, check_ip, check_port

    rest = [
        f
        for f, v in (
            ("--edge-devices", args.edge_devices),
            ("--edge-host", args.edge_host),
            ("--edge-ip", args.edge_ip),
        )
        if v
    ]
    if args.edge is None:
        if rest:
            raise ConfigError(f"{rest[0]} goes with --edge NAME (the edge's name, a room such as lab)")
        return None
    check_device_id(args.edge, "--edge")
    if not (args.edge_host or args.edge_ip):
        raise ConfigError(
            f"--edge {args.edge}: give the edge host's name with --edge-host and/or its address with --edge-ip"
        )
    if not args.edge_devices:
        raise ConfigError(f"--edge {args.edge}: --edge-devices needs at least one of the site's --devices")
    edge = EdgeSpec(
        args.edge,
        tuple(dict.fromkeys(check_host(h) for h in args.edge_host or ())),
        tuple(dict.fromkeys(check_ip(a) for a in args.edge_ip or ())),
        tuple(dict.fromkeys(args.edge_devices)),
        check_port(args.edge_port, "--edge-port"),
    )
    check_edge(edge, devices, [])
    return edge


def _cmd_site_add_device(args: argparse.Namespace) -> int:
    from server.site import add_device

    bundle = add_device(Path(args.dir), args.id, client_cert=args.client_cert)
    print(f"added {args.id!r}: its bundle is {bundle}")
    print(
        "a running broker takes the new password after a reload: `sudo systemctl reload mosquitto`, "
        "or `kill -HUP` the `covey broker run` process"
    )
    return 0


def _cmd_site_add_edge(args: argparse.Namespace) -> int:
    from server.site.edge import EdgeSpec
    from server.site.edge_files import add_edge

    edge = EdgeSpec(args.name, tuple(args.host or ()), tuple(args.ip or ()), tuple(args.devices or ()), args.port)
    folder = add_edge(Path(args.dir), edge)
    print(f"added the edge {args.name!r} in {folder}: its mosquitto bridges to the site's broker as edge.{args.name}")
    print(f"  its boards now dial it: {', '.join(edge.devices)} (give each its new device.toml from devices/<ID>/)")
    print("  a running central broker takes the bridge's user after a reload (SIGHUP, or systemctl reload mosquitto)")
    print(f"next, on the edge's host: covey edge run --site {args.dir} --edge {args.name}")
    return 0


def _cmd_site_sample_data(args: argparse.Namespace) -> int:
    from server.paths import femnist_dir
    from server.site.sample_data import sample_data

    leaf = Path(args.data_dir) if args.data_dir else femnist_dir()
    for board in sample_data(Path(args.dir), leaf):
        print(f"{board.device}: writer {board.writer}, {board.n_train} training and {board.n_test} test samples")
        print(f"  {board.train}  {board.test}")
    return 0


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _show_log(proc: subprocess.Popen[str]) -> None:
    """mosquitto's output, filtered (server/site/broker_log.py), until it ends."""
    from server.site.broker_log import DeniedCounter

    counter = DeniedCounter()
    assert proc.stdout is not None
    for line in proc.stdout:
        for shown in counter.feed(line):
            print(shown, flush=True)
    for shown in counter.due(force=True):
        print(shown, flush=True)


def _cmd_broker_run(args: argparse.Namespace) -> int:
    """mosquitto in the foreground with the site's config: SIGTERM and Ctrl-C stop it
    (it saves its sessions first), SIGHUP reloads the passwords and the ACL."""
    from server.broker import mosquitto_binary
    from server.site import load_site
    from server.site.broker_log import with_denials

    site = load_site(Path(args.site))
    conf, port, loopback = site.layout.broker_conf, site.spec.port, site.spec.loopback_port
    what = f"the covey site {site.spec.run!r}"
    remedy = "make the site again with `covey site init`"
    if args.edge is not None:
        from server.site.edge import edge_conf
        from server.site.edge_files import load_edge

        edge = load_edge(site, args.edge)
        conf, port, loopback = edge_conf(site.layout, edge.name), edge.port, None
        what = f"the edge {edge.name!r} of {what}, bridged to {site.spec.broker}"
        remedy = f"copy the site's edges/{edge.name}/ here from where `covey site add-edge` made it"
    if not conf.is_file():
        raise ConfigError(f"{conf} is missing; {remedy}")
    binary = mosquitto_binary()
    for host, port_, flag in (("", port, "--port"), ("127.0.0.1", loopback, "--loopback-port")):
        if port_ is not None and not _port_free(host, port_):
            raise ConfigError(
                f"port {port_} is in use (another mosquitto? `sudo systemctl stop mosquitto`), or "
                + (f"make the site with another {flag}" if args.edge is None else "add the edge with another --port")
            )
    plain = f" and plain MQTT on 127.0.0.1:{loopback}" if loopback else ""
    print(f"mosquitto for {what}: TLS on port {port}{plain}; Ctrl-C stops it")
    print(f"  mosquitto -c {conf}   (with debug logging, filtered: ACL refusals counted per board)", flush=True)
    # a copy with debug logging: mosquitto shows the ACL's refusals only there
    # (server/site/broker_log.py); it is read again on SIGHUP, so it lives as long as mosquitto
    scratch = tempfile.TemporaryDirectory(prefix="covey-broker-")
    running = Path(scratch.name) / "mosquitto.conf"
    running.write_text(with_denials(conf.read_text()))
    proc = subprocess.Popen(
        [binary, "-c", str(running)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    shown = threading.Thread(target=_show_log, args=(proc,), daemon=True)
    shown.start()

    def forward(signum: int, frame: FrameType | None) -> None:
        proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = proc.wait()  # the broker's whole life: it ends on a signal
    except KeyboardInterrupt:
        # Ctrl-C in a terminal reached mosquitto too; `kill -INT` of this process did not.
        # Either way mosquitto is told to save and stop (a second SIGINT changes nothing),
        # and killed if it has not within 15 s: it never outlives this command.
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shown.join(5)
        scratch.cleanup()
    if code != 0:
        raise ConfigError(f"mosquitto stopped with status {code}: see its messages above")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    site = sub.add_parser("site", help="a site: the broker's TLS and identities, and a bundle per board")
    site_sub = site.add_subparsers(dest="site_command", required=True, metavar="ACTION")
    p = site_sub.add_parser(
        "init",
        help="make a site folder: CA, broker certificate, passwords, mosquitto config and ACL, board bundles",
        description="Makes DIR with a private CA, the broker's certificate (every --host and --ip in its "
        "subjectAltName), a password per device and for the coordinator, mosquitto's password file, ACL and "
        "config, and DIR/devices/<ID>/ per board (device.toml, CA, password). Nothing is written unless every "
        "value is valid. Run as root, the broker's files are readable by the mosquitto user.",
    )
    p.add_argument("dir", metavar="DIR", help="the site folder to make (new or empty, or --force)")
    p.add_argument("--host", action="append", metavar="NAME", help="a name boards dial (repeatable)")
    p.add_argument("--ip", action="append", metavar="ADDR", help="an address boards dial (repeatable)")
    p.add_argument("--devices", nargs="+", metavar="ID", help="the boards' ids (more later with add-device)")
    p.add_argument("--run", default="site", help="run id the boards join (default: site)")
    p.add_argument("--port", type=int, default=8883, help="the TLS listener's port (default 8883)")
    p.add_argument("--loopback-port", type=int, metavar="P", help="also plain MQTT on 127.0.0.1:P")
    p.add_argument(
        "--client-certs",
        action="store_true",
        help="every client also needs a certificate from the site's CA (issued to each device and the coordinator)",
    )
    p.add_argument(
        "--system",
        action="store_true",
        help="for the system's mosquitto service (as root): persistence in /var/lib/mosquitto",
    )
    p.add_argument(
        "--broker-memory-mb",
        type=int,
        default=256,
        metavar="MB",
        help="mosquitto's memory_limit: past it the broker refuses messages and disconnects their sender "
        "(default 256; raise it for models over ~10 MB: at least eight models' worth)",
    )
    p.add_argument("--force", action="store_true", help="replace DIR if it holds anything (boards need new bundles)")
    p.add_argument("--edge", metavar="NAME", help="also an edge for one room, as `covey site add-edge` makes it")
    p.add_argument("--edge-devices", nargs="+", metavar="ID", help="with --edge: the boards in that room")
    p.add_argument("--edge-host", action="append", metavar="NAME", help="with --edge: a name its boards dial")
    p.add_argument("--edge-ip", action="append", metavar="ADDR", help="with --edge: an address its boards dial")
    p.add_argument("--edge-port", type=int, default=8883, metavar="PORT", help="with --edge: its TLS port (8883)")
    p.set_defaults(func=_cmd_site_init)

    p = site_sub.add_parser("add-device", help="add a board to a site: its password and bundle")
    p.add_argument("dir", metavar="DIR", help="the site folder")
    p.add_argument("id", metavar="ID", help="the new device's id")
    p.add_argument("--client-cert", action="store_true", help="issue a client certificate too")
    p.set_defaults(func=_cmd_site_add_device)

    p = site_sub.add_parser(
        "add-edge",
        help="give the boards of one room their own broker, bridged to the site's (docs/site-guide.md)",
        description="Makes DIR/edges/NAME/: a mosquitto for the edge's host (a certificate for every --host and --ip, "
        "the listed boards' passwords and ACL, and a TLS bridge to the site's broker as the user edge.NAME, which "
        "the site's ACL lets write and read only what those boards may). The boards' device.toml then names the edge.",
    )
    p.add_argument("dir", metavar="DIR", help="the site folder")
    p.add_argument("name", metavar="NAME", help="the edge's name (a room, e.g. lab)")
    p.add_argument("--host", action="append", metavar="NAME", help="a name the room's boards dial (repeatable)")
    p.add_argument("--ip", action="append", metavar="ADDR", help="an address the room's boards dial (repeatable)")
    p.add_argument("--devices", nargs="+", metavar="ID", help="the site's boards in that room")
    p.add_argument("--port", type=int, default=8883, help="the edge's TLS port (default 8883)")
    p.set_defaults(func=_cmd_site_add_edge)

    p = site_sub.add_parser(
        "sample-data",
        help="for a trial: one LEAF writer's data per board, as train.npz and test.npz in its bundle",
        description="Gives each board of the site one writer of a LEAF folder (the shared FEMNIST sample unless "
        "--data-dir), in file order, as DIR/devices/<ID>/train.npz and test.npz, for a trial whose boards have no data "
        "of their own. provision-device.sh BUNDLE BUNDLE/train.npz BUNDLE/test.npz installs them.",
    )
    p.add_argument("dir", metavar="DIR", help="the site folder")
    p.add_argument("--data-dir", metavar="LEAF_DIR", help="a LEAF folder with train/ and test/ (default: the sample)")
    p.set_defaults(func=_cmd_site_sample_data)

    broker = sub.add_parser("broker", help="the site's MQTT broker")
    broker_sub = broker.add_subparsers(dest="broker_command", required=True, metavar="ACTION")
    p = broker_sub.add_parser("run", help="run the site's mosquitto in the foreground (without systemd)")
    p.add_argument("--site", required=True, metavar="DIR", help="a folder made by `covey site init`")
    p.add_argument("--edge", metavar="NAME", help="run that edge's mosquitto (on its host), bridged to the site's")
    p.set_defaults(func=_cmd_broker_run)
