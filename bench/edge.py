"""``bench/edge.py``: what a site's edges save (issue 28), each strategy run twice on
issue 28's three-site field, through the edges and through the central broker only.

The field is ``examples/topologies/three-rooms.toml`` run by ``covey field-test``'s own
code (:mod:`server.field.fieldtest`) in network namespaces: 3 rooms of 4 boards, each
room on its own network (50 Mbit/s, 2 ms to its gateway), each gateway's uplink to the
central broker 4 Mbit/s (``tbf``) and 50 ms one way (a relay), the real mosquittos,
``covey server run``, ``covey edge run`` on the gateways and one agent per board. The
central run (``--central``) keeps the same hosts and links, and its gateways only
forward: every model crosses the uplinks. Both runs tell the coordinator the edges, so
the strategy sees the same site (HierFAVG groups by edge). Needs root and mosquitto.

Figures (central ÷ edge): ``edge_uplink_bytes_ratio_<strategy>`` (bytes on the
gateways' uplinks, both directions, from round 2 on: round 1 also holds registration
and the links' measurement) and ``edge_time_to_target_speedup_<strategy>`` (the rounds'
wall time until the server accuracy first reaches the lower of the two runs' best),
with the runs' own figures beside them.

``--faults`` instead runs HierFAVG through the edges of a TLS site on this machine's
loopback (``covey site init``, ``covey site add-edge``, ``covey broker run``, ``covey
edge run``; each uplink a :class:`~server.field.relay.Relay` of 4 Mbit/s and 50 ms) for
3 rounds twice: the first site's ``covey edge run`` killed (SIGKILL) once a board of its
round-2 group trained, then started again; and the first site's uplink cut for a
minute once its round-2 group runs. ``edge_restart_lost_contributions`` and
``edge_uplink_cut_lost_contributions``: boards that logged a round's training whose
result that round's models do not hold.

``--scale`` instead runs one coordinator with 4 edges and 1,000 devices (real agents, a
few processes of them: :mod:`server.lab.swarm`, Synthetic(1, 1) and MCLR) for 5 rounds
of HierFAVG, and the same devices on the central broker alone
(:func:`server.lab.edge_scale.scale_run`): ``edge_scale_devices``,
``edge_scale_coordinator_cpu_s_per_round`` and its RSS, the edges' CPU and RSS, and the
central reference's.

``--equivalence`` instead compares the simulator, told the same site, with 6 boards
through 2 edges in one process (:func:`server.lab.edges.sim_vs_edges`):
``sim_edge_max_abs_diff_<strategy>`` for HierFAVG and FedGSP, and DSC with the 6 boards
behind one edge (its groups follow links and labels, not rooms).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covey.cli import main
from covey.paths import femnist_dir
from server.broker import free_port, wait_for_port
from server.field.edges import EdgeMode
from server.field.fieldtest import plan_field_test, run_field_test
from server.field.relay import Impairment, Relay
from server.fleet import leaf_writers, start_fleet
from server.paths import ensure_model

REPO = Path(__file__).resolve().parent.parent
STRATEGIES = {
    "hierfavg": ("--strategy", "hierfavg", "--set", "tau2=2"),
    "fedavgic": ("--strategy", "fedavg_ic", "--set", "n_groups=3", "--set", "tau2=2"),
    "fedgsp": (
        "--strategy",
        "fedgsp",
    ),
}


def covey(*argv: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "covey.cli", *argv],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for_line(log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{text!r} not in {log} within {timeout} s:\n{log.read_text(errors='replace')[-2000:]}")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class Scene:
    """What a fault may act on while a run goes: its folder, the site, the uplinks and
    the processes (the central broker first, then each site's edge in order)."""

    work: Path
    site: Path
    names: list[str]
    relays: dict[str, Relay]
    procs: list[subprocess.Popen[bytes]]


Fault = Callable[[Scene], None]


def one_run(
    work: Path,
    strategy: str,
    *,
    sites: int,
    boards: int,
    rounds: int,
    uplink: Impairment,
    learning: tuple[str, ...] = (),
    fault: Fault | None = None,
) -> dict[str, Any]:
    """One run of ``strategy`` through the edges of a TLS site on loopback (with
    ``learning``'s extra flags, and ``fault`` beside it once the edges are up); returns
    its rounds, its wall times and the contributions lost (boards that logged a round's
    training its models do not hold)."""
    names = [f"s{k}" for k in range(1, sites + 1)]
    members = {s: [f"{s}-{i}" for i in range(1, boards + 1)] for s in names}
    devices = [d for s in names for d in members[s]]
    site = work / "site"
    port = free_port()
    argv = ["site", "init", str(site), "--host", "localhost", "--ip", "127.0.0.1", "--run", "edgebench"]
    assert main([*argv, "--port", str(port), "--loopback-port", str(free_port()), "--devices", *devices]) == 0
    relays = {s: Relay(("127.0.0.1", 0), ("127.0.0.1", port), uplink, seed=k).start() for k, s in enumerate(names)}
    for s in names:
        argv = ["site", "add-edge", str(site), s, "--host", "localhost", "--ip", "127.0.0.1"]
        assert main([*argv, "--port", str(free_port()), "--devices", *members[s]]) == 0
        conf = site / "edges" / s / "broker" / "mosquitto.conf"  # the bridge dials the site's uplink
        conf.write_text(conf.read_text().replace(f"address localhost:{port}", f"address localhost:{relays[s].port}"))
    procs = [covey("broker", "run", "--site", str(site), log=work / "central.log")]
    try:
        wait_for_port("127.0.0.1", port, 20, procs[0])
        for s in names:
            procs.append(covey("edge", "run", "--site", str(site), "--edge", s, log=work / f"edge-{s}.log"))
            wait_for_line(work / f"edge-{s}.log", f"edge {s}: group managers for", 60)
        root = femnist_dir()
        with start_fleet(
            root,
            leaf_writers(root, len(devices)),
            run="",
            host="",
            port=0,
            configs=[site / "devices" / d / "device.toml" for d in devices],
            device_ids=devices,
            log_dir=work / "boards",
        ):
            state = work / "state"
            scene = Scene(work, site, names, relays, procs)
            faulty = threading.Thread(target=fault, args=(scene,), daemon=True) if fault else None
            if faulty is not None:
                faulty.start()
            code = main(
                [
                    *("server", "run", "--site", str(site), *STRATEGIES[strategy], *learning),
                    *("--rounds", str(rounds)),
                    *("--min-devices", str(len(devices)), "--eval-data", str(root), "--state-dir", str(state)),
                    *("--register-timeout", "300", "--deadline", "300", "--links-every", "0"),
                ]
            )
            if code != 0:
                raise RuntimeError(f"covey server run ended with {code}")
    finally:
        stop(procs)
        for r in relays.values():
            r.stop()
    edge_logs = " ".join(p.read_text(errors="replace") for p in sorted(work.glob("edge-*.log")))
    at_edges = sum(int(n) for n in re.findall(r"stopped: (\d+) groups run here", edge_logs))
    rows = json.loads((state / "results.json").read_text())["rounds"]
    boards_said = "".join(p.read_text(errors="replace") for p in (work / "boards").glob("*.log"))
    trained = {(d, int(r)) for d, r in TRAINED.findall(boards_said)}
    held = {(d, int(r["round"])) for r in rows for d in r["trained_ids"]}
    return {
        "lost": len(trained - held),
        "skipped": sum(int(r["skipped"]) for r in rows),
        "accuracy": [float(r["server_accuracy"]) for r in rows],
        "wall_s": [float(r["wall_s"]) for r in rows],
        "groups_at_edges": at_edges,
        "groups": sum(len(r["groups"]) for r in rows),
    }


TRAINED = re.compile(r"(\S+): round (\d+) group \d+ position \d+ trained")


def when_round_2_runs_at(scene: Scene, site: str, trained: bool) -> bool:
    """Wait until round 2's group of ``site`` runs at its edge (and, with ``trained``, one
    of its boards has trained); False if that never came."""
    edge_log = scene.work / f"edge-{site}.log"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        started = re.search(r"round 2 group \d+: \d+ members, run here", edge_log.read_text(errors="replace"))
        boards = "".join(p.read_text(errors="replace") for p in (scene.work / "boards").glob(f"{site}-*.log"))
        if started and (not trained or re.search(r": round 2 group \d+ position \d+ trained", boards)):
            return True
        time.sleep(0.05)
    return False


def restart_an_edge(scene: Scene) -> None:
    """Kill the first site's ``covey edge run`` (SIGKILL) once a board of its round-2
    group trained, and start it again."""
    site = scene.names[0]
    if when_round_2_runs_at(scene, site, trained=True):
        scene.procs[1].kill()
        scene.procs[1].wait(15)
        scene.procs[1] = covey(
            "edge", "run", "--site", str(scene.site), "--edge", site, log=scene.work / f"edge-{site}-restarted.log"
        )


def cut_an_uplink(scene: Scene) -> None:
    """Cut the first site's uplink for a minute once its round-2 group runs at the edge."""
    if when_round_2_runs_at(scene, scene.names[0], trained=False):
        scene.relays[scene.names[0]].outage(60.0, stop_listening=True)


def faults(sites: int, boards: int, uplink: Impairment, only: str | None = None) -> int:
    """HierFAVG through the edges, 3 rounds whose members train a few hundred steps, with
    each fault in round 2; prints the contributions each lost."""
    learning = ("--set", "tau1=300", "--epochs", "20")
    for name, fault in (("restart", restart_an_edge), ("uplink_cut", cut_an_uplink)):
        if only is not None and name != only:
            continue
        with tempfile.TemporaryDirectory(prefix="covey-edgebench-") as tmp:
            os.chmod(tmp, 0o755)
            run = one_run(
                Path(tmp),
                "hierfavg",
                sites=sites,
                boards=boards,
                rounds=3,
                uplink=uplink,
                learning=learning,
                fault=fault,
            )
        print(f"{name}: {run['skipped']} skipped, rounds {' '.join(f'{w:.1f}' for w in run['wall_s'])} s")
        print(f"figure edge_{name}_lost_contributions = {run['lost']}")
    return 0


def time_to(target: float, run: dict[str, Any]) -> float:
    elapsed = 0.0
    for acc, wall in zip(run["accuracy"], run["wall_s"], strict=True):
        elapsed += wall
        if acc >= target:
            return elapsed
    return float("inf")


def equivalence(rounds: int) -> int:
    from server.lab.edges import federation, sim_vs_edges
    from server.paths import ensure_model
    from server.strategies import make_strategy
    from server.strategies.base import TrainConfig

    ids = [f"dev{i:03d}" for i in range(6)]
    edges = {"a": tuple(ids[:3]), "b": tuple(ids[3:])}
    train = TrainConfig(1, 10, 0.05, max_steps=5)
    makers: dict[str, dict[str, Any]] = {"hierfavg": {"tau2": 2}, "fedgsp": {}, "dsc": {"clients_per_round": 6}}
    for name, params in makers.items():
        # DSC groups by links and labels, not by room: every board behind one edge
        site = {"a": tuple(ids)} if name == "dsc" else edges
        with tempfile.TemporaryDirectory(prefix="covey-edgebench-") as tmp:
            diff, hosts = sim_vs_edges(
                lambda: make_strategy(name, train=train, **params),  # noqa: B023 (called at once)
                federation(femnist_dir(), ids),
                ensure_model("mlp_femnist"),
                Path(tmp),
                edges=site,
                rounds=rounds,
            )
        at = f"the {len(site)} edges" if len(site) > 1 else "the edge"
        print(f"{name}: {sum(h.groups_done for h in hosts)} groups run at {at} over {rounds} rounds")
        print(f"figure sim_edge_max_abs_diff_{name} = {diff:.3g}")
    return 0


def scale_one(devices: int, rounds: int, through_edges: bool) -> int:
    """One scale run in this process (its peak RSS is the coordinator's); prints it as JSON."""
    from dataclasses import asdict

    from server.lab.edge_scale import scale_run

    with tempfile.TemporaryDirectory(prefix="covey-edgebench-") as tmp:
        run = scale_run(Path(tmp), devices=devices, rounds=rounds, through_edges=through_edges)
    print(json.dumps(asdict(run)))
    return 0


def scale(devices: int, rounds: int) -> int:
    """The scale run through the edges and centrally, each in a process of its own."""
    from server.lab.edge_scale import ScaleFigures

    runs = {}
    for mode in ("edges", "central"):
        argv = [sys.executable, __file__, "--scale-one", mode, "--devices", str(devices), "--rounds", str(rounds)]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=7200, cwd=REPO).stdout
        runs[mode] = ScaleFigures(**json.loads(out.strip().splitlines()[-1]))
    edge, central = runs["edges"], runs["central"]
    for name, run in (("edges", edge), ("central", central)):
        print(
            f"{name}: {run.devices} devices, {run.rounds} rounds of {run.wall_s_per_round:.1f} s, trained per round "
            f"{run.trained_per_round}; coordinator {run.coordinator_cpu_s_per_round:.2f} CPU s per round, "
            f"{run.coordinator_rss_mb:.0f} MB RSS; brokers' CPU s per round "
            + ", ".join(f"{b} {s:.2f}" for b, s in run.broker_cpu_s_per_round.items())
        )
    print(f"groups run at the edges: {edge.groups_at_edges} of {rounds * len(edge.edge_cpu_s_per_round)}")
    print(f"figure edge_scale_devices = {edge.devices}")
    print(f"figure edge_scale_coordinator_cpu_s_per_round = {edge.coordinator_cpu_s_per_round:.2f}")
    print(f"figure edge_scale_coordinator_rss_mb = {edge.coordinator_rss_mb:.0f}")
    print(f"figure edge_scale_edge_cpu_s_per_round_max = {max(edge.edge_cpu_s_per_round):.2f}")
    print(f"figure edge_scale_edge_rss_mb_max = {max(edge.edge_rss_mb):.0f}")
    print(f"figure central_scale_coordinator_cpu_s_per_round = {central.coordinator_cpu_s_per_round:.2f}")
    print(f"figure central_scale_coordinator_rss_mb = {central.coordinator_rss_mb:.0f}")
    return 0


def field_run(topology: Path, strategy: str, mode: EdgeMode, rounds: int, out: Path) -> dict[str, Any]:
    """``strategy`` on the field of ``topology`` (:mod:`server.field.fieldtest`) with the
    gateways in ``mode``; returns its uplink bytes from round 2 on, its accuracy and wall
    time per round, and the groups run at the edges."""
    root = femnist_dir()
    server_args = [*STRATEGIES[strategy], "--model", "mlp_femnist", "--rounds", str(rounds)]
    server_args += ["--deadline", "300", "--register-timeout", "300", "--federated-eval-every", "0"]
    plan = plan_field_test(topology, root, out, server_args, edge_mode=mode, timeout_s=3600)
    run = run_field_test(plan, echo=False)
    rows = json.loads((plan.state_dir / "results.json").read_text())["rounds"]
    uplinks = run.traffic.uplinks[1:]
    return {
        "bytes": sum(b.up + b.down for b in uplinks),
        "accuracy": [float(r["server_accuracy"]) for r in rows],
        "wall_s": [float(r["wall_s"]) for r in rows],
        "groups_at_edges": run.groups_at_edges,
        "groups": sum(len(r["groups"]) for r in rows),
        "skipped": sum(int(r["skipped"]) for r in rows),
    }


def main_bench(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="of " + ", ".join(STRATEGIES))
    p.add_argument("--topology", default=str(REPO / "examples" / "topologies" / "three-rooms.toml"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--equivalence", action="store_true", help="the simulator against the edges instead")
    p.add_argument("--faults", action="store_true", help="an edge restarted and an uplink cut mid-round instead")
    p.add_argument("--fault", choices=("restart", "uplink_cut"), help="with --faults: this one only")
    p.add_argument("--scale", action="store_true", help="1,000 devices behind 4 edges instead")
    p.add_argument("--scale-one", choices=("edges", "central"), help=argparse.SUPPRESS)
    p.add_argument("--devices", type=int, default=1000, help="with --scale: devices in all")
    p.add_argument("--sites", type=int, default=3, help="with --faults: sites of the loopback site")
    p.add_argument("--boards", type=int, default=4, help="with --faults: boards per site")
    args = p.parse_args(argv)
    if args.equivalence:
        return equivalence(args.rounds)
    if args.scale_one:
        return scale_one(args.devices, args.rounds, args.scale_one == "edges")
    if args.scale:
        return scale(args.devices, rounds=5)
    if args.faults:
        return faults(args.sites, args.boards, Impairment(latency_ms=50.0, rate_mbit=4.0), args.fault)
    ensure_model("mlp_femnist")
    for strategy in args.strategies.split(","):
        runs = {}
        for mode in (EdgeMode.EDGE, EdgeMode.CENTRAL):
            with tempfile.TemporaryDirectory(prefix="covey-edgebench-") as tmp:
                runs[mode] = field_run(Path(args.topology), strategy, mode, args.rounds, Path(tmp))
        edge, central = runs[EdgeMode.EDGE], runs[EdgeMode.CENTRAL]
        target = min(max(edge["accuracy"]), max(central["accuracy"]))
        # a group that spans rooms runs as parts, one per room's edge (server/execution/split.py)
        at_edges = f"{edge['groups_at_edges']} groups or rooms' parts of groups, of {edge['groups']} groups"
        print(f"{strategy}: target accuracy {target:.3f}; run at the edges: {at_edges}")
        for name, run in (("edge", edge), ("central", central)):
            print(
                f"  {name}: {run['bytes'] / 1e6:.1f} MB on the uplinks from round 2, "
                f"rounds {sum(run['wall_s']):.1f} s, "
                f"to target {time_to(target, run):.1f} s, {run['skipped']} skipped, accuracy by round "
                + " ".join(f"{a:.3f}" for a in run["accuracy"])
            )
        print(f"figure edge_uplink_bytes_ratio_{strategy} = {central['bytes'] / edge['bytes']:.2f}")
        print(f"figure edge_time_to_target_speedup_{strategy} = {time_to(target, central) / time_to(target, edge):.2f}")
        print(f"figure edge_groups_at_edges_{strategy} = {edge['groups_at_edges']}")
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
