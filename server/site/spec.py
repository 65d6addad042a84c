"""What a site is (run, broker names and ports, devices) and the checks on it.

Every value is checked before anything is written, and a mistake names the flag, the
value and what it must be (one line, exit status 2 from the CLI).

Device ids at a site are stricter than the protocol's ids: a device id is also a
mosquitto user name (``:`` separates the name from the hash in the password file), a
folder name under ``devices/`` (``..`` would leave it) and a certificate's common name.
So a site id is 1-64 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or
a digit. ``coordinator`` (the coordinator's user) and ``server`` (the sender name of
the server in the protocol) are reserved.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from device.errors import ConfigError, CoveyError
from device.protocol import SERVER_ID, check_id
from server.site.mosquitto import COORDINATOR, DEFAULT_MEMORY_MB

SITE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RESERVED_IDS = (COORDINATOR, SERVER_ID)
EDGE_USER_PREFIX = "edge."  # the bridge user of an edge at the central broker: edge.<name>
DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
DEFAULT_PORT = 8883


@dataclass(frozen=True)
class SiteSpec:
    """A site: its run, the names and addresses boards dial, the ports, the devices."""

    run: str
    hosts: tuple[str, ...]
    ips: tuple[str, ...]
    devices: tuple[str, ...]
    port: int = DEFAULT_PORT
    loopback_port: int | None = None
    client_certs: bool = False
    system: bool = False  # files for the system's mosquitto service (persistence in /var/lib/mosquitto)
    broker_memory_mb: int = DEFAULT_MEMORY_MB  # mosquitto's memory_limit (server/site/mosquitto.py)

    @property
    def broker_host(self) -> str:
        """What boards dial: the first host name, else the first address."""
        return (self.hosts or self.ips)[0]

    @property
    def broker(self) -> str:
        """``HOST:PORT`` for device.toml and the coordinator."""
        return f"{self.broker_host}:{self.port}"


def check_device_id(value: str, flag: str = "--devices") -> str:
    if not SITE_ID.fullmatch(value):
        raise ConfigError(
            f"{flag}: device id {value!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter "
            "or a digit (it is also a broker user name and a folder name)"
        )
    if value in RESERVED_IDS:
        raise ConfigError(f"{flag}: {value!r} is reserved for the server; give the device another id")
    if value.startswith(EDGE_USER_PREFIX):
        # the central broker's user of an edge's bridge (server/site/edge.py): a board by
        # that name would share its password line and ACL, and speak for the edge's room
        raise ConfigError(f"{flag}: ids starting with {EDGE_USER_PREFIX!r} are reserved for edges; give another id")
    return value


def check_host(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        raise ConfigError(f"--host {value} is an IP address; give addresses with --ip and host names with --host")
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(DNS_LABEL.fullmatch(label) for label in labels):
        raise ConfigError(
            f"--host {value!r} is not a host name: dot-separated labels of letters, digits and '-' "
            "(e.g. broker.lan or raspberrypi.local)"
        )
    return value


def check_ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ConfigError(
            f"--ip {value!r} is not an IP address; give an IPv4 or IPv6 address of the broker host, e.g. 192.168.1.10"
        ) from None


def check_port(value: int, flag: str) -> int:
    if not 0 < value < 65536:
        raise ConfigError(f"{flag} must be a port from 1 to 65535, got {value}")
    return value


def check_spec(spec: SiteSpec) -> SiteSpec:
    """The spec with normalised addresses, or ConfigError naming the first mistake."""
    try:
        check_id(spec.run, "run id")
    except CoveyError:
        rule = "1-64 printable characters without '/', '+', '#' or spaces"
        raise ConfigError(f"--run {spec.run!r} must be {rule}") from None
    if not spec.hosts and not spec.ips:
        raise ConfigError("give the broker host's name with --host NAME and/or its address with --ip ADDR")
    hosts = tuple(check_host(h) for h in spec.hosts)
    ips = tuple(check_ip(a) for a in spec.ips)
    if not spec.devices:
        raise ConfigError("--devices needs at least one device id (more can be added with `covey site add-device`)")
    seen: set[str] = set()
    for device in spec.devices:
        check_device_id(device)
        if device in seen:
            raise ConfigError(f"--devices names {device!r} twice; every device needs its own id")
        seen.add(device)
    check_port(spec.port, "--port")
    if spec.loopback_port is not None:
        check_port(spec.loopback_port, "--loopback-port")
        if spec.loopback_port == spec.port:
            raise ConfigError(f"--loopback-port {spec.loopback_port} is also --port; give the two listeners two ports")
    if isinstance(spec.broker_memory_mb, bool) or not isinstance(spec.broker_memory_mb, int):
        raise ConfigError("--broker-memory-mb must be a whole number of MiB")
    if not 32 <= spec.broker_memory_mb <= 1024 * 1024:
        raise ConfigError(f"--broker-memory-mb {spec.broker_memory_mb} is out of range: 32 MiB to 1 TiB")
    return SiteSpec(
        spec.run,
        tuple(dict.fromkeys(hosts)),
        tuple(dict.fromkeys(ips)),
        spec.devices,
        spec.port,
        spec.loopback_port,
        spec.client_certs,
        spec.system,
        spec.broker_memory_mb,
    )
