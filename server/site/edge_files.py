"""``covey site add-edge``: write an edge's folder and point its boards at it.

::

    DIR/edges/<NAME>/edge.toml         what the edge is (name, hosts, ips, port, devices)
    DIR/edges/<NAME>/broker/           the edge's mosquitto: mosquitto.conf (with the bridge and its
                                       password: secret), ca.crt, broker.crt, broker.key, passwords,
                                       acl, data/
    DIR/edges/<NAME>/coordinator/      the edge's own coordinator user: password, ca.crt (and
                                       client.crt, client.key on a --client-certs site)

The edge's folder is written beside its final place and renamed into it; then the
central password file and ACL gain the bridge's user, and the room's bundles their new
broker address (each file written beside the old one and renamed over it). A running
central broker takes the new user on a reload (SIGHUP); the room's boards need their new
``device.toml``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from device.errors import ConfigError
from server.site.build import AGAIN, Site, _device_toml, _replace, _writing, load_site, read_secrets
from server.site.certs import issue_client, issue_server
from server.site.edge import (
    EDGE_TOML,
    EdgeSpec,
    bridge_text,
    central_acl_lines,
    check_edge,
    edge_dir,
    edge_passwords,
    edges_dir,
    load_edges,
)
from server.site.layout import CA_FILE, CERT_FILE, DEVICE_TOML, KEY_FILE, PASSWORD_FILE, Owners, toml_text
from server.site.mosquitto import COORDINATOR, BrokerFiles, acl_text, config_text, new_password, password_line
from server.site.spec import SiteSpec, check_device_id, check_host, check_ip, check_port


def load_edge(site: Site, name: str) -> EdgeSpec:
    for edge in load_edges(site.layout):
        if edge.name == name:
            return edge
    known = ", ".join(e.name for e in load_edges(site.layout)) or "none yet"
    raise ConfigError(f"the site has no edge {name!r} (edges: {known}); add it with `covey site add-edge`")


def add_edge(root: Path, edge: EdgeSpec) -> Path:
    """Add ``edge`` to the site in ``root``; returns the edge's folder."""
    site = load_site(root)
    spec, layout = site.spec, site.layout
    check_device_id(edge.name, "NAME")
    edge = EdgeSpec(
        edge.name,
        tuple(dict.fromkeys(check_host(h) for h in edge.hosts)),
        tuple(dict.fromkeys(check_ip(a) for a in edge.ips)),
        tuple(dict.fromkeys(edge.devices)),
        check_port(edge.port, "--port"),
    )
    check_edge(edge, spec.devices, load_edges(layout))
    ca, central_passwords = read_secrets(site)
    server = issue_server(ca, list(edge.hosts), list(edge.ips))
    bridge_password, own_password = new_password(), new_password()
    final = edge_dir(layout, edge.name)
    broker = final / "broker"
    files = BrokerFiles(
        broker / "ca.crt",
        broker / "broker.crt",
        broker / "broker.key",
        broker / "passwords",
        broker / "acl",
        broker / "data",
    )
    conf = config_text(
        spec.run,
        files,
        port=edge.port,
        loopback_port=None,
        client_certs=spec.client_certs,
        memory_mb=spec.broker_memory_mb,
    )
    # with --client-certs both brokers ask every client for a certificate: the bridge (at the
    # central broker) and the edge's own group managers (at the edge's) each get one
    bridge_cert = issue_client(ca, edge.user) if spec.client_certs else None
    own_cert = issue_client(ca, f"{edge.user}.{COORDINATOR}") if spec.client_certs else None
    cert_files = (str(broker / "bridge.crt"), str(broker / "bridge.key")) if bridge_cert else None
    conf += bridge_text(
        spec.run, edge, central=spec.broker, password=bridge_password, cafile=str(files.ca_cert), client_cert=cert_files
    )
    passwords = edge_passwords(central_passwords, edge, password_line(COORDINATOR, own_password))
    # every text of the central side too, before anything is written: a mistake (a board
    # without its bundle, another edge's unreadable edge.toml) leaves the site as it was
    central = {
        layout.passwords: central_passwords + password_line(edge.user, bridge_password),
        layout.broker_dir / "acl": acl_text(
            spec.run, spec.devices, [central_acl_lines(spec.run, e) for e in [*load_edges(layout), edge]]
        ),
    }
    moved = _replace_broker(spec, edge)
    bundles = {}
    for device in edge.devices:
        folder = layout.bundle(device)
        if not (folder / DEVICE_TOML).is_file():
            raise ConfigError(f"{folder / DEVICE_TOML} is missing; {AGAIN}")
        bundles[folder / DEVICE_TOML] = _device_toml(moved, device, (folder / CERT_FILE).exists())
    owners = Owners.here()
    with _writing(root):
        edges_dir(layout).mkdir(exist_ok=True)
        if final.exists():
            raise ConfigError(f"{final} exists; {AGAIN}, or give the edge another name")
        staging = Path(tempfile.mkdtemp(prefix=f".{edge.name}.", dir=edges_dir(layout)))
        try:
            os.rmdir(staging)
            owners.mkdir(staging, "site", mode=0o755 if owners.as_root else 0o700)
            b = staging / "broker"
            owners.mkdir(b, "broker")
            owners.write(b / "ca.crt", ca.cert_pem, "broker", secret=False)
            owners.write(b / "broker.crt", server.cert_pem, "broker", secret=False)
            owners.write(b / "broker.key", server.key_pem, "broker", secret=True)
            if bridge_cert is not None:
                owners.write(b / "bridge.crt", bridge_cert.cert_pem, "broker", secret=False)
                owners.write(b / "bridge.key", bridge_cert.key_pem, "broker", secret=True)
            owners.write(b / "passwords", passwords, "broker", secret=True)
            owners.write(b / "acl", acl_text(spec.run, edge.devices), "broker", secret=True)
            owners.write(b / "mosquitto.conf", conf, "broker", secret=True)  # it holds the bridge's password
            owners.data_dir(b / "data")
            c = staging / "coordinator"
            owners.mkdir(c, "admin")
            owners.write(c / CA_FILE, ca.cert_pem, "admin", secret=False)
            owners.write(c / PASSWORD_FILE, own_password + "\n", "admin", secret=True)
            if own_cert is not None:
                owners.write(c / CERT_FILE, own_cert.cert_pem, "admin", secret=False)
                owners.write(c / KEY_FILE, own_cert.key_pem, "admin", secret=True)
            owners.write(staging / EDGE_TOML, _edge_toml(spec.run, edge), "site", secret=False)
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        for path, text in central.items():
            _replace(owners, path, text, "broker", secret=True)
        for path, text in bundles.items():
            _replace(owners, path, text, "admin", secret=False)
    return final


def _replace_broker(spec: SiteSpec, edge: EdgeSpec) -> SiteSpec:
    """The site spec as the room's boards see it: the edge's names and port."""
    return dataclasses.replace(spec, hosts=edge.hosts, ips=edge.ips, port=edge.port)


def _edge_toml(run: str, edge: EdgeSpec) -> str:
    return toml_text(
        [f"An edge of the covey site {run!r}, written by `covey site add-edge`; make the site again to change it."],
        {
            "name": edge.name,
            "hosts": list(edge.hosts),
            "ips": list(edge.ips),
            "port": edge.port,
            "devices": list(edge.devices),
        },
    )
