"""Simulation on a topology: strategies get its SNR and RTT matrices, rounds their
modelled time, and a bad topology file is one clear line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from device.errors import ConfigError
from server.paths import ensure_model
from server.simulation.datasets import synthetic
from server.simulation.engine import Simulation
from server.simulation.topology import TopologyCostModel, link_matrices, load_topology, parse_topology
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

REPO = Path(__file__).resolve().parents[3]
OFFICE = REPO / "examples" / "topologies" / "office.toml"
TRAIN = TrainConfig(1, 10, 0.01)


def office_run(name: str, **params):  # type: ignore[no-untyped-def]
    topology = load_topology(OFFICE)
    fed = synthetic(1, 1, 12, seed=0)
    ids = sorted(fed)
    m = link_matrices(topology, ids)
    site = topology.site_of(ids)
    strategy = make_strategy(name, train=TRAIN, **params)
    sim = Simulation(
        strategy,
        fed,
        ensure_model("mclr_synthetic"),
        seed=0,
        snr_db=m.snr_db,
        distance=m.rtt_ms,
        cost_model=TopologyCostModel(topology=topology, site=site),
        federated_eval_every=0,
    )
    records = sim.run(2)
    return strategy, records, ids, [site[c].name for c in ids], m


def test_dsc_primary_groups_are_the_office_sites() -> None:
    from server.grouping.dsc import dsc_groups

    strategy, records, ids, sites, m = office_run("dsc", clients_per_round=12)
    counts = np.array([strategy.clients[c].class_counts for c in ids])
    primary, _ = dsc_groups(m.snr_db, counts, random_state=0)
    assert adjusted_rand_score(sites, primary) == 1.0
    assert all(np.isfinite(r.t_round_s) and r.t_round_s > 0 for r in records)


def test_fedavg_ic_groups_cut_the_intra_group_rtt_against_random_groups() -> None:
    strategy, _, ids, _, m = office_run("fedavg_ic", n_groups=3, tau1=1, tau2=5)
    labels = np.array([strategy.assignment[c] for c in ids])

    def intra(lab: np.ndarray) -> float:
        return float(sum(m.rtt_ms[np.ix_(lab == g, lab == g)].sum() for g in np.unique(lab)) / 2)

    rng = np.random.default_rng(0)
    random_sums = [intra(rng.permutation(labels)) for _ in range(200)]  # same group sizes
    reduction = 1 - intra(labels) / float(np.mean(random_sums))
    assert reduction >= 0.20, reduction


def test_a_chain_pays_each_hand_off_on_its_pair_link() -> None:
    topology = load_topology(OFFICE)
    ids = [f"c{i:02d}" for i in range(12)]
    site = topology.site_of(ids)
    lab, far = site["c00"], site["c08"]
    assert topology.pair(lab, lab).latency_ms == 1 and topology.pair(lab, far).latency_ms == 2 + 30
    assert topology.pair(lab, far).bandwidth_mbps == pytest.approx(6 * 0.98)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "needs at least one [[site]]"),
        ("[[site]]\nname = 'a'\ndevices = 0\nbandwidth_mbps = 1\n", "devices must be a whole number"),
        ("[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = -3\n", "bandwidth_mbps must be a number"),
        ("[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = 3\nlatncy_ms = 4\n", "unknown key 'latncy_ms'"),
        (
            "[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = 3\n[[link]]\nsites = ['a', 'b']\nbandwidth_mbps = 1\n",
            "sites must name two sites",
        ),
        (
            "[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = 3\n[[site]]\nname = 'a'\ndevices = 1\n"
            "bandwidth_mbps = 3\n",
            "site names must differ",
        ),
        ("speed = 3\n", "unknown key 'speed'"),
        (
            "[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = 3\n[[edge]]\nsite = 'b'\nbandwidth_mbps = 1\n",
            "site must name a site",
        ),
        (
            "[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = 3\n"
            + "[[edge]]\nsite = 'a'\nbandwidth_mbps = 1\n" * 2,
            "has an edge already",
        ),
        ("[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = 3\n[[edge]]\nsite = 'a'\n", "bandwidth_mbps is required"),
        ("[[site]\n", "not valid TOML"),
    ],
)
def test_bad_topology_files_are_named(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        load_topology(path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_a_site_behind_an_edge_reaches_the_server_over_its_uplink_and_its_own_devices_through_the_edge() -> None:
    # Prepare: issue 28's rooms (boards 50 Mbit/s, 2 ms to their edge; uplink 4 Mbit/s, 50 ms)
    topology = load_topology(REPO / "examples" / "topologies" / "two-rooms.toml")
    ids = [f"c{i}" for i in range(6)]

    # Execute
    m = link_matrices(topology, ids)
    north = topology.sites[0]

    # Assert: to the server, the uplink's rate and both latencies; within a room, the
    # room's links only; between rooms, both uplinks
    assert north.server_link.bandwidth_mbps == 4 and north.server_link.latency_ms == 52
    assert topology.edge_sites == topology.sites
    assert m.snr_db is not None and m.rtt_ms is not None
    assert m.snr_db[0, 0] == pytest.approx(north.server_link.snr(20e6))
    assert m.rtt_ms[0, 1] == 2 * (2 + 2) and m.rtt_ms[0, 3] == 2 * (52 + 52)
    assert m.snr_db[0, 1] > m.snr_db[0, 3]


def test_a_topology_for_another_number_of_clients_is_refused() -> None:
    topology = parse_topology({"site": [{"name": "a", "devices": 3, "bandwidth_mbps": 5}]})
    with pytest.raises(ConfigError, match="places 3 devices but the simulation has 4 clients"):
        topology.site_of(["a", "b", "c", "d"])


def test_a_link_far_beyond_its_bandwidth_caps_its_snr_instead_of_overflowing() -> None:
    topology = parse_topology({"bandwidth_mhz": 1, "site": [{"name": "a", "devices": 2, "bandwidth_mbps": 2000}]})
    m = link_matrices(topology, ["x", "y"])
    assert m.snr_db is not None and np.isfinite(m.snr_db).all() and m.snr_db[0, 0] > 100
    assert "t" in m.table().splitlines()[2]  # marked as from a topology file, not as a guess


def test_fedavg_ic_groups_on_a_measured_rtt_matrix_that_differs_by_direction() -> None:
    # A run on boards measures each direction (server/links.py): the matrix is not
    # symmetric, and once stopped the coordinator of a field test (exit status 2)
    topology = load_topology(OFFICE)
    fed = synthetic(1, 1, 12, seed=0)
    ids = sorted(fed)
    rtt = link_matrices(topology, ids).rtt_ms
    measured = rtt * np.random.default_rng(0).uniform(0.8, 1.2, rtt.shape)
    strategy = make_strategy("fedavg_ic", train=TRAIN, n_groups=3, tau1=1, tau2=5, clients_per_round=12)
    sim = Simulation(strategy, fed, ensure_model("mclr_synthetic"), seed=0, distance=measured, federated_eval_every=0)

    sim.run(2)

    assert sorted(strategy.assignment) == ids and len(set(strategy.assignment.values())) == 3


def test_a_round_is_timed_on_the_links_its_groups_models_cross() -> None:
    from server.strategies.base import GroupPlan, GroupResult, MemberResult, RoundPlan

    # Prepare: the office's 12 devices in their 3 sites, one group per site
    topology = load_topology(OFFICE)
    ids = [f"c{i:02d}" for i in range(12)]
    site = topology.site_of(ids)
    cost = TopologyCostModel(topology=topology, site=site)
    groups = [ids[0:4], ids[4:8], ids[8:12]]
    plan = RoundPlan(1, tuple(GroupPlan(g, tuple(m), "parallel", "w") for g, m in enumerate(groups)),
                     {"w": np.zeros(1)}, TRAIN)  # fmt: skip
    results = [GroupResult(g, tuple(MemberResult(c, 100, 0.0) for c in m)) for g, m in enumerate(groups)]
    n_bytes = 4_000_000
    train_s = 6 * n_bytes / 4 / cost.device_flops * 100 * TRAIN.epochs  # 6 FLOPs per parameter and sample

    # Execute
    t = {a: cost.round_costs(plan, results, 1, n_bytes, a)["t_round_s"] for a in ("server", "leader", "leader_only")}

    # Assert: every member crosses its server link both ways; or the leader, once each
    # way, after its members crossed their site's switch; or the switch alone
    far, far_pair = topology.sites[2].link, topology.pair(site["c08"], site["c09"])
    assert t["server"] == pytest.approx(2 * far.transfer_s(n_bytes) + train_s)
    assert t["leader_only"] == pytest.approx(2 * far_pair.transfer_s(n_bytes) + train_s)
    assert t["leader"] == pytest.approx(2 * far_pair.transfer_s(n_bytes) + train_s + 2 * far.transfer_s(n_bytes))
    assert t["leader_only"] < t["server"] < t["leader"]  # a leader pays the hops on top of its own link


def test_data_only_grouping_needs_a_topology_to_time() -> None:
    from server.simulation.config import SimulationConfig

    with pytest.raises(ConfigError, match="needs a topology"):
        SimulationConfig(link_grouping=False)
