"""A field test rehearsed on one machine: ``covey field-test TOPOLOGY --strategy NAME``.

The real broker, the real coordinator (``covey server run``) and one real agent per
device of the topology, each on its own host of a :class:`~server.field.netns.Lab`:

* a device's link to the broker follows its site's profile: bandwidth with ``tbf`` on
  both ends of its veth (:meth:`Lab.shape`), latency, jitter and loss with a
  :class:`~server.field.relay.Relay` in the device's own namespace, which the agent
  dials instead of the broker;
* every model, probe and message of covey passes the broker (MQTT is a star), so a
  topology's ``[[link]]`` between devices is not emulated: a field test shows what
  covey sees on a network where devices reach each other only through the broker.
  The topology's values are compared with the star's (:func:`star_topology`);
* nothing tells covey or the agents the topology: what grouping sees is what the
  coordinator measures (docs/links.md);
* a site with an ``[[edge]]`` has a gateway host (:mod:`server.field.edges`): its
  boards sit on a network of their own and dial the gateway, whose uplink to the
  broker is shaped as the ``[[edge]]`` says; the gateway runs the room's broker and
  ``covey edge run`` (:attr:`EdgeMode.EDGE`, the coordinator places groups there), or
  only forwards to the central broker (:attr:`EdgeMode.CENTRAL`: the same links, no
  edge). The coordinator is told the edges either way (``--edge``).

:func:`plan_field_test` checks every setting before anything is created;
:func:`run_field_test` runs the test and returns its wall time and what each round
put on the links (:class:`TrafficMeter`); :mod:`server.field.report` reads the
coordinator's results back against the topology.
Needs root (network namespaces) and mosquitto.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from device.errors import ConfigError, TransportError
from server.broker import LOCAL_CONF, local_config_text
from server.field.edge_faults import EdgeProcess, FieldFault, FieldScene
from server.field.edges import EDGE_PORT, UPLINK_RELAY_PORT, EdgeMode, edge_config_text
from server.field.netns import PREFIX, Host, Lab, LinkBytes, available
from server.fleet import REPO
from server.simulation.topology import LinkProfile, Site, Topology, load_topology

BROKER_PORT = 1883
RELAY_PORT = 1884  # on each device's own loopback


@dataclass(frozen=True)
class FieldDevice:
    """One emulated board: its id, its site and the LEAF writer whose data it holds."""

    device_id: str
    site: Site
    writer: str


@dataclass(frozen=True)
class FieldTestPlan:
    """Everything a field test needs, checked (:func:`plan_field_test`)."""

    topology: Topology
    devices: tuple[FieldDevice, ...]
    data_root: Path
    out_dir: Path
    server_args: tuple[str, ...]  # passed on to ``covey server run``
    run_id: str = field(default_factory=lambda: f"field{uuid.uuid4().hex[:6]}")
    lab_tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])  # namespaces cvlab-<tag>-*
    seed: int = 0
    timeout_s: float = 3600.0
    edge_mode: EdgeMode = EdgeMode.EDGE  # what the gateways of ``[[edge]]`` sites do

    @property
    def edges(self) -> dict[str, tuple[str, ...]]:
        """Each ``[[edge]]`` site's edge name (its slug) and the devices behind it."""
        return {
            site_slug(s.name): tuple(d.device_id for d in self.devices if d.site.name == s.name)
            for s in self.topology.edge_sites
        }

    @property
    def state_dir(self) -> Path:
        return self.out_dir / "state"

    @property
    def log_dir(self) -> Path:
        return self.out_dir / "logs"


@dataclass(frozen=True)
class LinkTraffic:
    """What the lab's links carried in each round, as their veths count it:
    ``devices`` (every device's link, summed), ``coordinator`` (its host's link) and
    ``broker`` (the broker's link, which every message crosses twice: in and out).
    Round 1 counts from the coordinator's start, so it holds registration, the
    model's download and the link measurement too. Empty when the counters could not
    be read (``error`` says why)."""

    devices: tuple[LinkBytes, ...] = ()
    coordinator: tuple[LinkBytes, ...] = ()
    broker: tuple[LinkBytes, ...] = ()
    uplinks: tuple[LinkBytes, ...] = ()  # the gateways' uplinks, summed (topologies with [[edge]])
    error: str = ""

    def as_dict(self) -> dict[str, dict[str, list[int]]]:
        """``{"devices": {"down": [per round], "up": [...]}, "coordinator": ..., "broker": ...}``
        (and ``"uplinks"`` with gateways); ``{}`` when nothing was measured."""
        if not self.devices:
            return {}
        roles = [("devices", self.devices), ("coordinator", self.coordinator), ("broker", self.broker)]
        roles += [("uplinks", self.uplinks)] if self.uplinks else []
        return {role: {"down": [b.down for b in rounds], "up": [b.up for b in rounds]} for role, rounds in roles}


@dataclass(frozen=True)
class FieldRun:
    """A finished field test: the coordinator's wall time, what the links carried, and
    the groups the edges ran (their ``covey edge run`` summaries; 0 without edges)."""

    wall_s: float
    traffic: LinkTraffic
    groups_at_edges: int = 0


_LAB_FAILURES = (TransportError, OSError, subprocess.SubprocessError)  # `ip` failed, hung or is gone


class TrafficMeter:
    """Reads the lab's link counters at the start and each time the coordinator's
    ``results.json`` records another round (polled every ``interval`` s on its own
    thread). Rounds recorded between two polls share the bytes between them equally;
    at a 0.1 s poll against rounds of seconds that does not happen in practice.
    Bytes still queued on a shaped link toward a host count as received by it
    (:meth:`~server.field.netns.Lab.link_bytes`), so a reading mid-transfer puts both
    ends of a packet in the same round.

    The count starts at zero rounds whatever ``results.json`` holds at the start: a
    field test's coordinator starts afresh and replaces the file of an earlier test in
    the same folder, which is never read. When the counters cannot be read (an
    ``iproute2`` without JSON output), the meter measures nothing and says why in
    :attr:`LinkTraffic.error`; the field test goes on.

    Parameters
    ----------
    lab : the running lab.
    results : the coordinator's ``results.json`` (it is replaced whole on each round).
    devices : the lab's host names of the devices (the rest: ``server``, ``broker``).
    gateways : the host names of the sites' gateways, whose links are the uplinks.
    """

    def __init__(
        self, lab: Lab, results: Path, devices: Sequence[str], interval: float = 0.1, gateways: Sequence[str] = ()
    ) -> None:
        self.lab, self.results, self.devices, self.interval = lab, results, tuple(devices), interval
        self.gateways = tuple(gateways)
        self._seen: tuple[int, int] | None = None
        self._rounds()  # an earlier test's file: seen, not counted
        self._lock = threading.Lock()  # the thread's polls and stop()'s last one
        self._samples: list[tuple[int, dict[str, LinkBytes]]] = []
        self.error = ""
        try:
            self._samples.append((0, lab.link_bytes()))
        except _LAB_FAILURES as e:
            self.error = f"the lab's link counters could not be read: {e}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="field-traffic", daemon=True)
        if self._samples:
            self._thread.start()

    @property
    def rounds_measured(self) -> int:
        """Rounds whose bytes have been read so far."""
        with self._lock:
            return self._samples[-1][0] if self._samples else 0

    def _rounds(self) -> int | None:
        """Rounds on record now; None when the file is missing, unchanged or being replaced."""
        try:
            st = self.results.stat()
            if (st.st_mtime_ns, st.st_size) == self._seen:
                return None
            rounds = len(json.loads(self.results.read_text()).get("rounds", []))
        except (OSError, ValueError):
            return None
        self._seen = (st.st_mtime_ns, st.st_size)
        return rounds

    def poll(self) -> None:
        """Read the counters now if another round is on record (the thread calls this)."""
        with self._lock:
            if not self._samples:
                return
            rounds = self._rounds()
            if rounds is not None and rounds > self._samples[-1][0]:
                self._samples.append((rounds, self.lab.link_bytes()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except _LAB_FAILURES as e:  # the lab is going away (SIGTERM): what was read stands
                self.error = f"the lab's link counters stopped: {e}"
                return

    def stop(self) -> LinkTraffic:
        """Stop polling (after one last look at the file) and return the rounds' bytes."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        with contextlib.suppress(*_LAB_FAILURES):
            self.poll()
        per_round: dict[str, list[LinkBytes]] = {"devices": [], "coordinator": [], "broker": [], "uplinks": []}
        with self._lock:
            samples = list(self._samples)
        for (r0, s0), (r1, s1) in itertools.pairwise(samples):
            delta = {name: s1[name] - s0[name] for name in s1}
            shares = {
                "devices": sum((delta[d] for d in self.devices), LinkBytes()),
                "coordinator": delta["server"],
                "broker": delta["broker"],
                "uplinks": sum((delta[g] for g in self.gateways), LinkBytes()),
            }
            n = r1 - r0  # > 0: a sample is taken only for more rounds than the last
            for role, b in shares.items():
                per_round[role] += [LinkBytes(b.down // n, b.up // n)] * n
        return LinkTraffic(
            devices=tuple(per_round["devices"]),
            coordinator=tuple(per_round["coordinator"]),
            broker=tuple(per_round["broker"]),
            uplinks=tuple(per_round["uplinks"]) if self.gateways else (),
            error=self.error,
        )


def site_slug(name: str) -> str:
    """A site's name made topic-safe: its devices' id prefix and its edge's name."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:40]


def device_ids(topology: Topology) -> list[tuple[str, Site]]:
    """``<site>-<k>`` for each site's devices, in the file's order (the site's name
    with anything but letters, digits, ``-`` and ``_`` replaced by ``_``)."""
    out = []
    for site in topology.sites:
        out += [(f"{site_slug(site.name)}-{k:02d}", site) for k in range(1, site.devices + 1)]
    if len({d for d, _ in out}) != len(out):
        raise ConfigError(f"{topology.source}: two sites give the same device ids; name the sites apart")
    return out


def plan_field_test(
    topology_path: Path | str,
    data_root: Path,
    out_dir: Path,
    server_args: Sequence[str],
    *,
    seed: int = 0,
    timeout_s: float = 3600.0,
    edge_mode: EdgeMode = EdgeMode.EDGE,
) -> FieldTestPlan:
    """Check the topology, the data, the machine and the output folder.

    Parameters
    ----------
    topology_path
        A topology TOML (:mod:`server.simulation.topology`).
    data_root
        A LEAF folder with ``train/`` and ``test/``; device k holds the k-th writer.
    out_dir
        Where the state, logs, report and plot go (created).
    server_args
        Options for ``covey server run`` (strategy, model, rounds, ...).
    edge_mode
        What the gateways of the ``[[edge]]`` sites run (:class:`EdgeMode`).

    Returns
    -------
    FieldTestPlan
        Raises :class:`ConfigError` naming the first problem.
    """
    from device.data import read_leaf

    data_root, out_dir = data_root.resolve(), out_dir.resolve()  # the processes run from the repo
    topology = load_topology(topology_path)
    links = [s.link for s in topology.sites] + [s.uplink for s in topology.edge_sites if s.uplink is not None]
    if any(link.bandwidth_mbps < 0.1 for link in links):
        raise ConfigError(f"{topology.source}: a field test shapes links of 0.1 Mbit/s or more")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; give a folder")
    if not (data_root / "train").is_dir() or not (data_root / "test").is_dir():
        raise ConfigError(f"--data-dir {data_root} needs train/ and test/ folders of LEAF JSON")
    writers = list(read_leaf(data_root / "train"))
    ids = device_ids(topology)
    if len(ids) > len(writers):
        raise ConfigError(
            f"{topology.source} has {len(ids)} devices but {data_root / 'train'} only {len(writers)} writers"
        )
    if len(ids) > 200:
        raise ConfigError(f"{topology.source} has {len(ids)} devices; a field test on one machine takes at most 200")
    ok, why = available()
    if not ok:
        raise ConfigError(f"a field test needs network namespaces: {why}")
    if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists():
        raise ConfigError("a field test needs mosquitto (apt install mosquitto)")
    devices = tuple(FieldDevice(d, s, w) for (d, s), w in zip(ids, writers, strict=False))
    return FieldTestPlan(
        topology, devices, data_root, out_dir, tuple(server_args), seed=seed, timeout_s=timeout_s, edge_mode=edge_mode
    )


def namespace_prefix(plan: FieldTestPlan) -> str:
    """The names of the network namespaces ``plan``'s test makes (and removes) start so."""
    return f"{PREFIX}-{plan.lab_tag}-"


def _mosquitto() -> str:
    return shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def _agent_argv(plan: FieldTestPlan, device: FieldDevice, broker: str) -> list[str]:
    return [
        *(sys.executable, "-m", "device.cli", "--broker", broker, "--run", plan.run_id, "--id", device.device_id),
        *("--data", str(plan.data_root / "train"), "--test", str(plan.data_root / "test"), "--user", device.writer),
        *("--state-dir", str(plan.out_dir / "devices" / device.device_id), "--threads", "1"),
        *("--idle-timeout", str(int(plan.timeout_s)), "-v"),
    ]


def run_field_test(plan: FieldTestPlan, *, echo: bool = True, fault: FieldFault | None = None) -> FieldRun:
    """Run the field test of ``plan``; returns the coordinator's wall time in seconds
    and the bytes each round put on the links (:class:`TrafficMeter`). ``fault`` runs in
    a thread beside the coordinator (:mod:`server.field.edge_faults`).

    The lab (namespaces, processes) is removed on return, also on failure. The
    coordinator's output goes to this process's (``echo``) and to ``logs/server.log``.
    Raises :class:`TransportError` when the broker does not come up or the coordinator
    fails (its last lines in the message).
    """
    # an earlier test in the same folder: its logs and its edges' tasks are not this one's
    for stale in (plan.log_dir, plan.out_dir / "edges"):
        shutil.rmtree(stale, ignore_errors=True)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    with Lab(tag=plan.lab_tag) as lab:
        broker = lab.add_host("broker")
        server = lab.add_host("server")
        central = f"{broker.ip}:{BROKER_PORT}"
        # each [[edge]] site: a gateway on the main network, and the site's own network behind it
        rooms: dict[str, tuple[Host, int]] = {}
        for k, site in enumerate(plan.topology.edge_sites, start=1):
            gateway = lab.add_host(f"gw{k}")
            lab.attach(gateway, k)
            rooms[site.name] = (gateway, k)
        hosts = {
            d.device_id: lab.add_host(f"d{i + 1:03d}", rooms[d.site.name][1] if d.site.name in rooms else 0)
            for i, d in enumerate(plan.devices)
        }
        conf = plan.out_dir / "mosquitto.conf"
        conf.write_text(local_config_text(LOCAL_CONF, BROKER_PORT, broker.ip))
        lab.start(broker, [_mosquitto(), "-c", str(conf)], log=plan.log_dir / "broker.log")
        lab.wait_for_port(server, broker.ip, BROKER_PORT)
        dial: dict[str, str] = {}  # site name -> where its boards' broker is
        scene = FieldScene(lab, plan.log_dir, members=plan.edges)
        for k, site in enumerate(plan.topology.edge_sites, start=1):
            gateway, network = rooms[site.name]
            scene.gateways[site_slug(site.name)] = gateway
            dial[site.name] = _start_gateway(
                lab, plan, site, gateway, gateway.addresses[network], central, k, env, scene
            )
        for i, d in enumerate(plan.devices):
            host, link = hosts[d.device_id], d.site.link
            lab.shape(host, link.bandwidth_mbps)
            address = dial.get(d.site.name, central)
            if link.latency_ms or link.jitter_ms or link.loss:
                address = _start_relay(lab, host, plan, d.device_id, link, f"127.0.0.1:{RELAY_PORT}", address, i, env)
            lab.start(host, _agent_argv(plan, d, address), log=plan.log_dir / f"{d.device_id}.log", env=env, cwd=REPO)
        argv = [*(sys.executable, "-m", "covey.cli", "server", "run", "--broker", central)]
        argv += ["--run", plan.run_id, "--min-devices", str(len(plan.devices)), "--state-dir", str(plan.state_dir)]
        argv += ["--eval-data", str(plan.data_root), "--seed", str(plan.seed), *plan.server_args]
        for name, members in plan.edges.items():  # also centrally: the strategies see the same site
            argv += ["--edge", f"{name}={','.join(members)}"]
        meter = TrafficMeter(
            lab,
            plan.state_dir / "results.json",
            [h.name for h in hosts.values()],
            gateways=[g.name for g, _ in rooms.values()],
        )
        faulty = threading.Thread(target=fault, args=(scene,), name="field-fault", daemon=True) if fault else None
        start = time.perf_counter()
        try:
            if faulty is not None:
                faulty.start()
            tail = _run_tee(server.argv(argv), plan.log_dir / "server.log", env, plan.timeout_s, echo)
            wall = time.perf_counter() - start
        finally:
            scene.done.set()
            if faulty is not None:
                faulty.join(60)  # an uplink it took down comes up again before the lab goes
            traffic = meter.stop()
    if traffic.error and echo:
        print(f"note: {traffic.error}; the report has no bytes per link", flush=True)
    if tail is not None:
        raise TransportError(
            f"the coordinator failed ({_reason(tail)}); its log: {plan.log_dir / 'server.log'}"
            if echo
            else f"the coordinator failed; its last lines ({plan.log_dir / 'server.log'}):\n{tail}"
        )
    return FieldRun(wall, traffic, groups_at_edges(plan.log_dir))


def groups_at_edges(log_dir: Path) -> int:
    """Groups the edges ran, as their ``covey edge run`` summaries say (0 without edges)."""
    said = " ".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("edge-*.log")))
    return sum(int(n) for n in re.findall(r"stopped: (\d+) groups run here", said))


def _start_relay(
    lab: Lab,
    host: Host,
    plan: FieldTestPlan,
    name: str,
    link: LinkProfile,
    listen: str,
    to: str,
    index: int,
    env: dict[str, str],
) -> str:
    """A :mod:`server.field.relay` on ``host`` from ``listen`` to ``to`` with ``link``'s
    latency, jitter and loss; returns ``listen``."""
    relay = [sys.executable, "-m", "server.field.relay", "--listen", listen, "--to", to]
    relay += ["--latency-ms", str(link.latency_ms), "--jitter-ms", str(link.jitter_ms), "--loss", str(link.loss)]
    relay += ["--seed", str(plan.seed * 1000 + index)]
    lab.start(host, relay, log=plan.log_dir / f"relay-{name}.log", env=env, cwd=REPO)
    ip, _, port = listen.rpartition(":")
    lab.wait_for_port(host, ip, int(port))
    return listen


def _start_gateway(
    lab: Lab,
    plan: FieldTestPlan,
    site: Site,
    gateway: Host,
    room_ip: str,
    central: str,
    k: int,
    env: dict[str, str],
    scene: FieldScene,
) -> str:
    """A site's gateway (:mod:`server.field.edges`): its uplink shaped, and the room's
    broker with ``covey edge run`` (edge mode, in ``scene.edges``) or a relay to
    ``central``; returns the address the room's boards dial."""
    assert site.uplink is not None
    name = site_slug(site.name)
    lab.shape(gateway, site.uplink.bandwidth_mbps)
    room = f"{room_ip}:{EDGE_PORT}"
    if plan.edge_mode is EdgeMode.CENTRAL:  # the room's messages go up as they are
        return _start_relay(lab, gateway, plan, f"uplink-{name}", site.uplink, room, central, 900 + k, env)
    uplink = _start_relay(
        lab, gateway, plan, f"uplink-{name}", site.uplink, f"127.0.0.1:{UPLINK_RELAY_PORT}", central, 900 + k, env
    )
    folder = plan.out_dir / "edges" / name
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "mosquitto.conf"
    conf.write_text(edge_config_text(plan.run_id, name, plan.edges[name], listen=room_ip, uplink=uplink))
    lab.start(gateway, [_mosquitto(), "-c", str(conf)], log=plan.log_dir / f"broker-{name}.log")
    lab.wait_for_port(gateway, room_ip, EDGE_PORT)
    log = plan.log_dir / f"edge-{name}.log"
    argv = [*(sys.executable, "-m", "covey.cli", "edge", "run", "--broker", room, "--run", plan.run_id)]
    argv += ["--edge", name, "--devices", ",".join(plan.edges[name]), "--state-dir", str(folder / "state")]
    scene.edges[name] = EdgeProcess(argv, log, env, REPO, lab.start(gateway, argv, log=log, env=env, cwd=REPO))
    wait_for_text(log, f"edge {name}: group managers for", 60)
    return room


def wait_for_text(log: Path, text: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Return once ``log`` holds ``text``; :class:`TransportError` with the log's end
    after ``timeout`` seconds, or as soon as ``proc`` (the process writing it) exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.is_file() and text in log.read_text(errors="replace"):
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-600:] if log.is_file() else "(no log)"
    raise TransportError(f"{log.name} did not say {text!r} within {timeout:g} s; its end:\n{tail}")


def _reason(tail: str) -> str:
    """The coordinator's own last words (its error line), with how it ended."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    said = [ln for ln in lines[:-1] if "rounds:" not in ln and "registered:" not in ln]
    return f"{said[-1]}; {lines[-1].strip('()')}" if said else lines[-1].strip("()")


def _run_tee(argv: list[str], log: Path, env: dict[str, str], timeout_s: float, echo: bool) -> str | None:
    """Run ``argv``, its output to ``log`` and (``echo``) to stdout; ``None`` when it
    succeeded, else the last lines of its output. Killed after ``timeout_s``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        assert proc.stdout is not None
        try:
            while chunk := os.read(proc.stdout.fileno(), 65536):  # b"" once the coordinator exits (or is killed)
                out.write(chunk)
                if echo:  # as it comes: progress bars redraw with "\r", not "\n"
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
            code = proc.wait(timeout=30)
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
    if code == 0:
        return None
    lines = log.read_text(errors="replace").splitlines()
    reason = f"killed after {timeout_s:g} s" if code == -9 else f"exit status {code}"
    return "\n".join([*lines[-15:], f"({reason})"])
