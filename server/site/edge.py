"""An edge of a site: a mosquitto in one room, bridged to the site's central broker.

``covey site add-edge DIR NAME --host H --devices ID...`` gives the devices of one room
their own broker (issue 28). Boards keep their identity and password; only the broker
address in their ``device.toml`` changes. The edge's folder ``DIR/edges/NAME/`` holds:

* ``mosquitto.conf``: a TLS listener for the room's boards (a certificate from the site's
  CA for the edge's names), the same password and ACL rules as the central broker for
  those boards, and a **bridge** to the central broker over TLS;
* ``passwords``, ``acl``: the room's boards (their hashes copied from the central
  password file) and the edge's own ``coordinator`` user (readwrite ``covey/#`` on the
  edge only: what the edge's group managers will log in as); ``coordinator/`` its
  credentials.

The bridge logs in to the central broker as the user ``edge.NAME``. The central ACL lets
that user write exactly what the room's boards may write (each board's ``from/<id>/``
topics and its hand-offs) and read what they may read, plus the edge's own
``from/edge.NAME/`` (its groups' reports and models) and ``edge/NAME/`` (its tasks): an
edge cannot speak for a board of another room, and the coordinator still takes the
sender from the topic. The bridge forwards each board's registration and status out,
each board's topics in, and what the server publishes for everyone; a board's
``results`` and ``frames`` it forwards only as the edge host republishes them under
``covey/<run>/relay/`` (``server/edge/host.py``: what a group run at the edge waits for
stays in the room). ``try_private`` keeps a message from coming back the way it went.
``cleansession false`` with a stable client id: while the uplink is down, each broker
queues what the other side has subscribed to (up to its queue bounds) and sends it on
reconnection.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from device.errors import ConfigError
from server.site.layout import SiteLayout
from server.site.mosquitto import DEVICE_READS, acl_text
from server.site.spec import EDGE_USER_PREFIX

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEVICE_WRITE_KINDS = ("register", "results", "frames", "status")
# what the edge host reads first (server/edge/host.py): a board's outputs and replies,
# handled at the edge when a group run there waits for them, else relayed under RELAY
RELAYED_KINDS = ("results", "frames")
RELAY = "relay/"  # covey/<run>/relay/from/<id>/<kind> at the edge is covey/<run>/from/<id>/<kind> centrally
BRIDGE_QOS = 1  # covey publishes everything at QoS 1
# every edge bridge's connection options (the module docstring says why)
BRIDGE_OPTIONS = (
    "bridge_protocol_version mqttv311",
    "try_private true",
    "cleansession false",
    "notifications false",
    "restart_timeout 1 30",
    "keepalive_interval 30",
)


@dataclass(frozen=True)
class EdgeSpec:
    """One edge: its name, the names and addresses its room's boards dial, its port, and
    the boards (devices of the site) that connect to it instead of the central broker."""

    name: str
    hosts: tuple[str, ...]
    ips: tuple[str, ...]
    devices: tuple[str, ...]
    port: int = 8883

    @property
    def user(self) -> str:
        """The bridge's user name at the central broker."""
        return edge_user(self.name)

    @property
    def broker(self) -> str:
        """``HOST:PORT`` the room's boards dial."""
        return f"{(self.hosts or self.ips)[0]}:{self.port}"


def edge_user(name: str) -> str:
    return f"{EDGE_USER_PREFIX}{name}"


def check_edge(edge: EdgeSpec, site_devices: Sequence[str], others: Sequence[EdgeSpec]) -> None:
    """ConfigError naming the first mistake: an edge of an unknown device, a device that
    already has an edge, an edge name in use, or no address."""
    if not edge.hosts and not edge.ips:
        raise ConfigError(f"edge {edge.name!r}: give the edge host's name with --host and/or its address with --ip")
    if not edge.devices:
        raise ConfigError(f"edge {edge.name!r}: --devices needs at least one of the site's devices")
    for other in others:
        if other.name == edge.name:
            raise ConfigError(f"the site already has an edge {edge.name!r}; give another name")
        taken = sorted(set(other.devices) & set(edge.devices))
        if taken:
            raise ConfigError(f"{taken[0]!r} already connects to the edge {other.name!r}; a board has one broker")
    unknown = sorted(set(edge.devices) - set(site_devices))
    if unknown:
        raise ConfigError(
            f"{unknown[0]!r} is not a device of the site; add it first (`covey site add-device DIR {unknown[0]}`)"
        )
    if edge.user in site_devices:
        raise ConfigError(f"{edge.user!r} is a device id of the site; give the edge another name")


def central_acl_lines(run: str, edge: EdgeSpec) -> list[str]:
    """The central ACL's lines for an edge's bridge: its boards' writes and reads, no more."""
    lines = [
        f"user {edge.user}",
        f"topic write covey/{run}/from/{edge.user}/#",  # its groups' reports and models, its status
        f"topic read covey/{run}/edge/{edge.name}/#",  # the tasks and start models the coordinator sends it
    ]
    for device in edge.devices:
        lines += [f"topic write covey/{run}/from/{device}/{kind}" for kind in DEVICE_WRITE_KINDS]
        lines += [f"topic write covey/{run}/device/+/frames/from/{device}", f"topic read covey/{run}/device/{device}/#"]
    lines += [line.format(run=run) for line in DEVICE_READS]
    return lines


def bridge_text(
    run: str, edge: EdgeSpec, *, central: str, password: str, cafile: str, client_cert: tuple[str, str] | None = None
) -> str:
    """The bridge section of the edge's mosquitto.conf (see the module docstring);
    ``client_cert``: the bridge's certificate and key, for a site whose broker asks
    every client for one (``--client-certs``)."""
    lines = [
        "",
        f"# The bridge to the site's central broker, over TLS, as the user {edge.user}: the central ACL",
        "# lets it write and read exactly what this room's boards may.",
        "connection central",
        f"address {central}",
        f"remote_username {edge.user}",
        f"remote_password {password}",
        f"remote_clientid {edge.user}",
        f"local_clientid {edge.user}.local",
        f"bridge_cafile {cafile}",
        *([f"bridge_certfile {client_cert[0]}", f"bridge_keyfile {client_cert[1]}"] if client_cert else []),
        "bridge_insecure false",
        *BRIDGE_OPTIONS,
    ]
    return "\n".join(lines + bridge_topics(run, edge.name, edge.devices)) + "\n"


def bridge_topics(run: str, name: str, devices: Sequence[str]) -> list[str]:
    """The ``topic`` lines of an edge's bridge (see the module docstring): what the
    server publishes for everyone and each board's topics in, the boards' registration,
    status and hand-offs out, their results and frames only as the edge host relays
    them, and the edge's own reports out and tasks in."""
    q, user = BRIDGE_QOS, edge_user(name)
    lines = [
        f"topic covey/{run}/artifact/# in {q}",
        f"topic covey/{run}/shared/# in {q}",
        f"topic covey/{run}/server/status in {q}",
        f"topic covey/{run}/from/{user}/# out {q}",
        f"topic covey/{run}/edge/{name}/# in {q}",
    ]
    for device in devices:
        lines += [
            f"topic covey/{run}/from/{device}/{kind} out {q}"
            for kind in DEVICE_WRITE_KINDS
            if kind not in RELAYED_KINDS
        ]
        # what the edge host relays (server/edge/host.py): prefix stripped on the way up
        lines += [f"topic from/{device}/{kind} out {q} covey/{run}/{RELAY} covey/{run}/" for kind in RELAYED_KINDS]
        lines += [
            f"topic covey/{run}/device/+/frames/from/{device} out {q}",
            f"topic covey/{run}/device/{device}/# in {q}",
        ]
    return lines


def edge_passwords(central_passwords: str, edge: EdgeSpec, coordinator_line: str) -> str:
    """The edge's password file: its boards' lines copied from the central file (their
    passwords do not change) and the edge's own coordinator user."""
    lines = {line.split(":", 1)[0]: line for line in central_passwords.splitlines() if ":" in line}
    missing = [d for d in edge.devices if d not in lines]
    if missing:
        raise ConfigError(f"the site's password file has no entry for {missing[0]!r}; was it edited?")
    return "".join(lines[d] + "\n" for d in edge.devices) + coordinator_line


EDGE_TOML = "edge.toml"


def edges_dir(layout: SiteLayout) -> Path:
    return layout.root / "edges"


def edge_dir(layout: SiteLayout, name: str) -> Path:
    return edges_dir(layout) / name


def edge_conf(layout: SiteLayout, name: str) -> Path:
    return edge_dir(layout, name) / "broker" / "mosquitto.conf"


def central_acl(layout: SiteLayout, run: str, devices: Sequence[str]) -> str:
    """The central broker's ACL with every edge's bridge user."""
    return acl_text(run, devices, [central_acl_lines(run, e) for e in load_edges(layout)])


def load_edges(layout: SiteLayout) -> list[EdgeSpec]:
    """The site's edges, by name (none for a site without ``edges/``)."""
    folder = edges_dir(layout)
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob(f"*/{EDGE_TOML}")):
        try:
            raw = tomllib.loads(path.read_text())
            out.append(
                EdgeSpec(
                    str(raw["name"]),
                    tuple(raw["hosts"]),
                    tuple(raw["ips"]),
                    tuple(raw["devices"]),
                    int(raw["port"]),
                )
            )
        except (OSError, KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(
                f"cannot read {path} ({exc}); was it edited? Make the site again to change an edge"
            ) from None
    return out
