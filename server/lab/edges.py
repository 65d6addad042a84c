"""Runs through a site's edges in one process, and the simulator beside them (issue 28).

:func:`run_with_edges` runs the real coordinator, one agent per device and an
:class:`~server.edge.host.EdgeHost` per edge over one :class:`~server.loopback.LoopbackBroker`
(which stands for the room's brokers and the central one alike: the coordinator also
sees the room's outputs and counts them as duplicates; the bridged brokers run in
``tests/site/test_edge.py`` and ``bench/edge.py``). :func:`sim_vs_edges` compares such a
run with the simulator given the same site. ``tests/server/test_edge_groups.py`` asserts
on them and ``bench/edge.py --equivalence`` prints the figures.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from device.data import read_leaf
from device.protocol import WireCodec
from server.backend import RoundRecord
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.edge.host import EdgeHost, EdgeSettings
from server.fleet import leaf_writers
from server.loopback import LoopbackBroker, LoopbackFleet
from server.simulation.datasets import ClientData
from server.simulation.engine import Simulation
from server.strategies.base import Strategy

RUN = "edges"


def federation(root: Path, ids: list[str]) -> dict[str, ClientData]:
    """One LEAF writer per device, in file order."""
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    return {d: ClientData(train[w], test[w]) for d, w in zip(ids, leaf_writers(root, len(ids)), strict=True)}


def run_with_edges(
    strategy: Strategy,
    data: Mapping[str, ClientData],
    model_path: Path,
    work: Path,
    *,
    edges: Mapping[str, tuple[str, ...]],
    edge_hosts: bool = True,
    rounds: int = 4,
    seed: int = 3,
    deadline_s: float = 60.0,
    codec: WireCodec = "fp32",
) -> tuple[list[RoundRecord], list[EdgeHost]]:
    """``rounds`` of ``strategy`` on a site with ``edges``, models travelling in
    ``codec``: with their hosts running, or (``edge_hosts=False``) with them offline,
    every group then run by the coordinator."""
    broker, stop, hosts, threads = LoopbackBroker(), threading.Event(), [], []
    config = CoordinatorConfig(
        RUN, "", 0, work / "state", seed=seed, deadline_s=deadline_s, edges=dict(edges), codec=codec
    )
    try:
        for name, devices in edges.items() if edge_hosts else ():
            host = EdgeHost(EdgeSettings(RUN, name, devices, "", 0), link_factory=broker.link)
            host.connect()
            hosts.append(host)
            threads.append(threading.Thread(target=host.serve, args=(stop,), daemon=True))
            threads[-1].start()
        fleet = {d: (c.train, c.test) for d, c in data.items()}
        with LoopbackFleet(broker, fleet, run=RUN, state_dir=work / "agents"):
            coordinator = Coordinator(config, strategy, model_path, link_factory=broker.link)
            records = coordinator.run_rounds(len(fleet), rounds)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for host in hosts:
            host.close()
    return records, hosts


def models(strategy: Strategy) -> list[np.ndarray]:
    assert strategy.global_weights is not None
    return [strategy.global_weights, *getattr(strategy, "group_models", [])]


def max_abs_diff(a: Strategy, b: Strategy) -> float:
    """The largest difference over every model the two strategies keep."""
    return max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(models(a), models(b), strict=True))


def sim_vs_edges(
    make: Callable[[], Strategy],
    data: Mapping[str, ClientData],
    model_path: Path,
    work: Path,
    *,
    edges: Mapping[str, tuple[str, ...]],
    rounds: int = 4,
    seed: int = 3,
    codec: WireCodec = "fp32",
) -> tuple[float, list[EdgeHost]]:
    """The simulator (fp32) against the boards through their edges in ``codec``, same
    seed and site: the largest difference of their models, and the edge hosts (what
    they ran)."""
    simulated = make()
    Simulation(simulated, dict(data), model_path, seed=seed, federated_eval_every=0, edges=edges).run(rounds)
    edged = make()
    _, hosts = run_with_edges(edged, data, model_path, work, edges=edges, rounds=rounds, seed=seed, codec=codec)
    return max_abs_diff(simulated, edged), hosts
