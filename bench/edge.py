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

``--faults`` instead runs HierFAVG through the edges of the same field for 3 rounds
twice (:mod:`server.field.edge_faults`): the first room's ``covey edge run`` killed
(SIGKILL) while the members of its round-2 group train, then started again; and the
first room's uplink taken down for a minute once its round-2 group runs at its edge.
``edge_restart_lost_contributions`` and ``edge_uplink_cut_lost_contributions``: boards
that logged a round's training whose result that round's models do not hold.

``--scale`` instead runs one coordinator with 4 edges and 1,000 devices (real agents, a
few processes of them: :mod:`server.lab.swarm`, Synthetic(1, 1) and MCLR) for 5 rounds
of HierFAVG, and the same devices on the central broker alone
(:func:`server.lab.edge_scale.scale_run`): ``edge_scale_devices``,
``edge_scale_coordinator_cpu_s_per_round`` and its RSS, the edges' CPU and RSS, and the
central reference's.

``--equivalence`` instead compares the simulator, told the same site, with 6 boards
through 2 edges in one process (:func:`server.lab.edges.sim_vs_edges`):
``sim_edge_max_abs_diff_<strategy>`` for HierFAVG and FedGSP, and DSC with the 6 boards
behind one edge (its groups follow links and labels, not rooms); then HierFAVG with the
group models going up as int8 and int4 deltas (``..._hierfavg_int8``, ``_int4``) and
``edge_group_model_bytes_ratio_fp32_to_<codec>``: what the edges sent up, fp32 ÷ codec.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from covey.paths import femnist_dir
from device.protocol import WireCodec
from server.field.edge_faults import (
    FieldFault,
    FieldScene,
    cut_uplink,
    lost_contributions,
    restart_edge,
    wait_for_round_at_edge,
)
from server.field.edges import EdgeMode
from server.field.fieldtest import plan_field_test, run_field_test
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


def restart_first_edge(scene: FieldScene) -> None:
    """Kill the first room's ``covey edge run`` (SIGKILL) once every member of its
    round-2 group holds its start model (they train), and start it again."""
    edge = next(iter(scene.edges))
    if wait_for_round_at_edge(scene, edge, 2, training=True):
        restart_edge(scene, edge)


def cut_first_uplink(scene: FieldScene) -> None:
    """Take the first room's uplink down for a minute once its round-2 group runs at
    its edge."""
    edge = next(iter(scene.edges))
    if wait_for_round_at_edge(scene, edge, 2, training=False):
        cut_uplink(scene, edge, 60.0)


FAULTS: dict[str, FieldFault] = {"restart": restart_first_edge, "uplink_cut": cut_first_uplink}


def faults(topology: Path, only: str | None = None) -> int:
    """HierFAVG through the edges of ``topology``'s field, 3 rounds whose members train
    a few thousand steps, with each fault in round 2; prints the contributions each
    lost."""
    root = femnist_dir()
    server_args = [*STRATEGIES["hierfavg"], "--model", "mlp_femnist", "--rounds", "3"]
    server_args += ["--set", "tau1=2000", "--epochs", "200", "--deadline", "300", "--register-timeout", "300"]
    server_args += ["--federated-eval-every", "0"]
    for name, fault in FAULTS.items():
        if only is not None and name != only:
            continue
        with tempfile.TemporaryDirectory(prefix="covey-edgebench-") as tmp:
            plan = plan_field_test(topology, root, Path(tmp), server_args, edge_mode=EdgeMode.EDGE, timeout_s=3600)
            run_field_test(plan, echo=False, fault=fault)
            rows = json.loads((plan.state_dir / "results.json").read_text())["rounds"]
            lost = lost_contributions(plan.log_dir, plan.state_dir / "results.json")
            said = " ".join(p.read_text(errors="replace") for p in plan.log_dir.glob("edge-*.log"))
        walls = " ".join(f"{float(r['wall_s']):.1f}" for r in rows)
        taken_up = sum(int(n) for n in re.findall(r"took up (\d+) groups again", said))
        print(
            f"{name}: {sum(int(r['skipped']) for r in rows)} skipped, {taken_up} groups taken up again after "
            f"a restart, rounds {walls} s"
        )
        print(f"figure edge_{name}_lost_contributions = {lost}")
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
    runs: list[tuple[str, WireCodec]] = [(name, "fp32") for name in makers]
    runs += [("hierfavg", "int8"), ("hierfavg", "int4")]  # the group models go up as deltas
    sent_up: dict[WireCodec, int] = {}
    for name, codec in runs:
        # DSC groups by links and labels, not by room: every board behind one edge
        site = {"a": tuple(ids)} if name == "dsc" else edges
        with tempfile.TemporaryDirectory(prefix="covey-edgebench-") as tmp:
            diff, hosts = sim_vs_edges(
                lambda: make_strategy(name, train=train, **makers[name]),  # noqa: B023 (called at once)
                federation(femnist_dir(), ids),
                ensure_model("mlp_femnist"),
                Path(tmp),
                edges=site,
                rounds=rounds,
                codec=codec,
            )
        at = f"the {len(site)} edges" if len(site) > 1 else "the edge"
        if name == "hierfavg":
            sent_up[codec] = sum(h.sent_up_bytes for h in hosts)
        suffix = "" if codec == "fp32" else f"_{codec}"
        print(f"{name} ({codec}): {sum(h.groups_done for h in hosts)} groups run at {at} over {rounds} rounds")
        print(f"figure sim_edge_max_abs_diff_{name}{suffix} = {diff:.3g}")
    for codec in ("int8", "int4"):
        print(f"figure edge_group_model_bytes_ratio_fp32_to_{codec} = {sent_up['fp32'] / sent_up[codec]:.1f}")
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
    args = p.parse_args(argv)
    if args.equivalence:
        return equivalence(args.rounds)
    if args.scale_one:
        return scale_one(args.devices, args.rounds, args.scale_one == "edges")
    if args.scale:
        return scale(args.devices, rounds=5)
    if args.faults:
        return faults(Path(args.topology), args.fault)
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
