"""The simulator's bus (server/simulation/virtual_bus.py): the coordinator's group
managers over virtual devices that run a board's task code, on a clock of its own."""

from __future__ import annotations

import time

import numpy as np
import pytest

from server.simulation.datasets import synthetic
from server.simulation.engine import SIM_DEADLINE_S, VirtualDevices
from server.simulation.faults import Faults
from server.strategies.base import GroupPlan, RoundPlan, TrainConfig

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.05)


@pytest.fixture(scope="module")
def model(zoo_model):  # type: ignore[no-untyped-def]
    return zoo_model("mclr_synthetic")


@pytest.mark.parametrize("handoff", ["direct", "relay"])
def test_a_silent_member_moves_the_bus_clock_to_its_deadline_and_costs_no_wall_time(model, handoff: str) -> None:
    # Prepare: a chain of four whose second member never answers
    fed = synthetic(1, 1, 4, seed=3)
    ids = tuple(sorted(fed))
    devices = VirtualDevices(fed, model, faults=Faults(unresponsive=frozenset({ids[1]})), handoff=handoff)  # type: ignore[arg-type]
    plan = RoundPlan(1, (GroupPlan(0, ids, "chain", "m"),), {"m": devices.initial_weights()}, TRAIN)

    # Execute
    started = time.monotonic()
    try:
        (result,) = devices.execute(plan, seed=0)
    finally:
        devices.close()
    wall = time.monotonic() - started

    # Assert: skipped at its deadline on the bus's clock, and the chain went on without it
    assert result.skipped == (ids[1],)
    assert [m.client_id for m in result.members] == [ids[0], *ids[2:]]
    assert devices.bus.now() >= SIM_DEADLINE_S
    assert wall < SIM_DEADLINE_S / 4  # behaviour, not speed: the deadline was never waited for


def test_a_member_whose_training_diverges_reports_failure_and_is_refused_at_once(model) -> None:
    # Prepare: a learning rate no model survives
    fed = synthetic(1, 1, 3, seed=3)
    ids = tuple(sorted(fed))
    devices = VirtualDevices(fed, model, handoff="relay")
    start = devices.initial_weights()
    plan = RoundPlan(1, (GroupPlan(0, ids, "chain", "m"),), {"m": start}, TrainConfig(epochs=1, batch_size=10, lr=1e36))

    # Execute
    try:
        (result,) = devices.execute(plan, seed=0)
    finally:
        devices.close()

    # Assert: each member said `failed` (as a board does) and was refused before any deadline
    assert set(result.refused) == set(ids)
    assert not result.members
    assert devices.bus.now() < SIM_DEADLINE_S
    assert result.final_weights is not None
    np.testing.assert_array_equal(result.final_weights, start)


def test_fp32_models_reach_the_managers_as_read_only_views_and_their_frames_are_counted(model) -> None:
    # Prepare: one parallel group of three in fp32
    fed = synthetic(1, 1, 3, seed=3)
    ids = tuple(sorted(fed))
    devices = VirtualDevices(fed, model)
    start = devices.initial_weights()
    plan = RoundPlan(1, (GroupPlan(0, ids, "parallel", "m"),), {"m": start}, TRAIN)

    # Execute
    try:
        (result,) = devices.execute(plan, seed=0)
        counts = devices.round_stats().wire_bytes
    finally:
        devices.close()

    # Assert: no copy on the way (a receiver that wrote into one would raise), and the
    # bytes of the frames a board would send: the shared start model reached each
    # member, and each member sent its output
    assert [m.client_id for m in result.members] == list(ids)
    for member in result.members:
        assert member.weights is not None and not member.weights.flags.writeable
    model_bytes = 4 * start.size
    assert 3 * model_bytes < counts["down"] < 3 * (model_bytes + 1024)
    assert 3 * model_bytes < counts["up"] < 3 * (model_bytes + 1024)
    assert counts["peer"] == 0
