"""A virtual LAN on one machine: hosts in Linux network namespaces on bridges.

:class:`Lab` creates a namespace for the LAN (holding the bridges: ``br0``, and one
more per extra network, as a site's own room behind its gateway) and one per host,
each host linked to a bridge by a veth pair created directly inside the two
namespaces, with an address on that bridge's private /24 (``10.77.<network>.<k>``).
A host on two networks (a gateway) has a veth on each; nothing routes between them. Nothing is created in, or routed to,
the machine's own network namespace: traffic stays between the lab's hosts. Link
shaping uses the kernel's ``tbf`` queueing discipline (``netem`` is not available on
these machines; latency, jitter, loss and outages come from
:mod:`server.field.relay`). :meth:`Lab.close` kills what the lab started and deletes
every namespace it made — also when a test fails, and (by name prefix) what an
earlier crashed lab left behind.

Needs root (or CAP_NET_ADMIN) and iproute2; :func:`available` says whether this
machine can, and why not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from device.errors import TransportError

PREFIX = "cvlab"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise TransportError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def available() -> tuple[bool, str]:
    """Whether network namespaces can be made here, and the reason when not."""
    if shutil.which("ip") is None:
        return False, "iproute2 (`ip`) is not installed"
    name = f"{PREFIX}-probe-{uuid.uuid4().hex[:6]}"
    proc = _ip("netns", "add", name, check=False)
    if proc.returncode != 0:
        return False, f"cannot create network namespaces ({proc.stderr.strip() or 'not permitted'}); run as root"
    _ip("netns", "del", name, check=False)
    return True, ""


def leftovers() -> list[str]:
    proc = _ip("netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.startswith(PREFIX)]


@dataclass
class Host:
    name: str
    netns: str
    ip: str  # on its first network
    lan_if: str  # the host's veth end inside the LAN namespace (egress there = traffic to the host)
    addresses: dict[int, str] = field(default_factory=dict)  # network -> the host's address there

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass(frozen=True)
class LinkBytes:
    """What a host's link carried, as its veth counts it: ``down`` to the host, ``up``
    from it (whole frames: payload, MQTT, TCP, IP and Ethernet headers, probes)."""

    down: int = 0
    up: int = 0

    def __add__(self, other: LinkBytes) -> LinkBytes:
        return LinkBytes(self.down + other.down, self.up + other.up)

    def __sub__(self, other: LinkBytes) -> LinkBytes:
        return LinkBytes(self.down - other.down, self.up - other.up)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait for the block: their handlers are swapped for one that
    notes them, and each noted signal is raised again once the old handlers are back.
    (Blocking them with a signal mask would cover this thread only; the kernel may hand
    a signal to another thread, and Python still runs its handler here.) Outside the
    main thread, where handlers cannot be set, the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: noted.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


@dataclass
class Lab:
    """Hosts ``10.77.<network>.<k>/24`` on bridges, named ``cvlab-<tag>-<host>``."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    net: int = 77
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        ok, why = available()
        if not ok:
            raise TransportError(why)
        self.lan = f"{PREFIX}-{self.tag}-lan"
        self._on_network: dict[int, int] = {}  # network -> addresses given there
        self._veths = 0
        _ip("netns", "add", self.lan)
        self._bridge(0)

    def _bridge(self, network: int) -> str:
        """The bridge of ``network`` (made the first time)."""
        bridge = f"br{network}"
        if network not in self._on_network:
            if not 0 <= network <= 250:
                raise TransportError(f"a lab's networks are numbered 0 to 250, not {network}")
            _ip("-n", self.lan, "link", "add", bridge, "type", "bridge")
            _ip("-n", self.lan, "link", "set", bridge, "up")
            self._on_network[network] = 0
        return bridge

    def _plug(self, netns: str, dev: str, network: int) -> tuple[str, str]:
        """A new veth ``dev`` from ``netns`` to ``network``'s bridge with the next address
        there; returns the address and the veth's end in the LAN namespace."""
        bridge = self._bridge(network)
        index = self._on_network[network] + 1
        if index > 250:
            raise TransportError(f"a lab's network holds at most 250 hosts (network {network} is full)")
        self._on_network[network] = index
        self._veths += 1
        lan_if = f"p{self._veths}"
        _ip("link", "add", dev, "netns", netns, "type", "veth", "peer", "name", lan_if, "netns", self.lan)
        _ip("-n", self.lan, "link", "set", lan_if, "master", bridge)
        _ip("-n", self.lan, "link", "set", lan_if, "up")
        ip = f"10.{self.net}.{network}.{index}"
        _ip("-n", netns, "addr", "add", f"{ip}/24", "dev", dev)
        _ip("-n", netns, "link", "set", dev, "up")
        return ip, lan_if

    def add_host(self, name: str, network: int = 0) -> Host:
        """A namespace with ``eth0`` on ``network`` (0: the lab's main one) and loopback up."""
        if len(self.hosts) >= 250:
            raise TransportError("a lab holds at most 250 hosts")
        netns = f"{PREFIX}-{self.tag}-{name}"
        _ip("netns", "add", netns)
        _ip("-n", netns, "link", "set", "lo", "up")
        ip, lan_if = self._plug(netns, "eth0", network)
        host = Host(name, netns, ip, lan_if, {network: ip})
        self.hosts[name] = host
        return host

    def attach(self, host: Host, network: int) -> str:
        """Give ``host`` one more interface (``eth1``, ...), on ``network``; returns its
        address there. Its link counters and :meth:`shape` stay those of its first."""
        if network in host.addresses:
            raise TransportError(f"{host.name} is on network {network} already")
        ip, _ = self._plug(host.netns, f"eth{len(host.addresses)}", network)
        host.addresses[network] = ip
        return ip

    def shape(self, host: Host, rate_mbit: float, burst_kb: int = 64, latency_ms: int = 400) -> None:
        """Limit the host's link to ``rate_mbit`` both ways (``tbf`` on each veth end)."""
        spec = ["rate", f"{rate_mbit}mbit", "burst", f"{burst_kb}kb", "latency", f"{latency_ms}ms"]
        subprocess.run(
            ["ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", *spec],
            check=True,
            capture_output=True,
            timeout=30,
        )
        subprocess.run(
            ["ip", "netns", "exec", self.lan, "tc", "qdisc", "replace", "dev", host.lan_if, "root", "tbf", *spec],
            check=True,
            capture_output=True,
            timeout=30,
        )

    def link_bytes(self) -> dict[str, LinkBytes]:
        """Every host's link counters so far, by host name: read on the LAN side of its
        veth, where what the LAN sends is what the host receives. What waits in the
        queue of a shaped link toward the host (``tbf`` holds up to rate x 400 ms: 6.4 MB
        at 128 Mbit/s) counts as received: it has left the sender, and a reading that
        missed it would put the two ends of one transfer in different rounds."""
        # the queues first, then the counters: what leaves a queue between the two reads
        # is counted twice, what enters it once on the sender's side only, and in a
        # steady transfer the two are the same bytes (read the other way round, both
        # errors have the same sign: the device showed 11 kB more than was sent)
        both = subprocess.run(
            ["ip", "netns", "exec", self.lan, "sh", "-c", "tc -s -j qdisc show; echo; ip -s -j link show"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        queues, _, listing = both.partition("\n")
        try:
            stats = {e["ifname"]: e["stats64"] for e in json.loads(listing)}
            # a queue counts a segmentation-offload packet with the headers of every
            # segment it will become, the link counters with one: the backlog is taken in
            # the link's units, by the ratio of what the link and the queue counted so far
            queued: dict[str, float] = {}
            for q in json.loads(queues or "[]"):
                dev, backlog, through = q["dev"], int(q.get("backlog", 0)), int(q.get("bytes", 0))
                sent = int(stats[dev]["tx"]["bytes"]) if dev in stats else 0
                queued[dev] = queued.get(dev, 0.0) + (backlog * min(1.0, sent / through) if through else backlog)
            return {
                name: LinkBytes(
                    down=int(stats[h.lan_if]["tx"]["bytes"]) + round(queued.get(h.lan_if, 0.0)),
                    up=int(stats[h.lan_if]["rx"]["bytes"]),
                )
                for name, h in self.hosts.items()
            }
        except (ValueError, KeyError, TypeError) as e:  # an iproute2 without -j, or a link gone
            raise TransportError(f"cannot read the lab's link counters ({e!r}): {listing[:200]!r}") from e

    def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``; killed by :meth:`close`."""
        out = log.open("ab") if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            host.argv(argv), stdout=out, stderr=subprocess.STDOUT, env=env or dict(os.environ), cwd=cwd
        )
        self.processes.append(proc)
        return proc

    def run(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        timeout: float = 300,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host`` to completion."""
        return subprocess.run(
            host.argv(argv), capture_output=True, text=True, timeout=timeout, env=env or dict(os.environ), cwd=cwd
        )

    def wait_for_port(self, host: Host, ip: str, port: int, timeout: float = 30.0) -> None:
        """Return once ``ip:port`` accepts a TCP connection from inside ``host``."""
        probe = (
            "import socket,sys,time\n"
            f"end=time.monotonic()+{timeout}\n"
            "while True:\n"
            f"    try: socket.create_connection(({ip!r}, {port}), 1).close(); sys.exit(0)\n"
            "    except OSError:\n"
            "        if time.monotonic()>end: sys.exit(1)\n"
            "        time.sleep(0.1)\n"
        )
        if self.run(host, [sys.executable, "-c", probe], timeout=timeout + 10).returncode != 0:
            raise TransportError(f"nothing accepted connections on {ip}:{port} from {host.name} within {timeout:g} s")

    def close(self) -> None:
        """Stop every process the lab started and remove its namespaces. SIGINT and
        SIGTERM wait until it is done (a second Ctrl-C during cleanup once left
        namespaces behind); they are raised again after. Nothing long-lived may start
        in here."""
        with _signals_held():
            self._close()

    def _close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for netns in [h.netns for h in self.hosts.values()] + [self.lan]:
            _ip("netns", "del", netns, check=False)
        for netns in leftovers():
            if netns.startswith(f"{PREFIX}-{self.tag}-"):
                _ip("netns", "del", netns, check=False)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
