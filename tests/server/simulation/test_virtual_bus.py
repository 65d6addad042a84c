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


def test_a_device_without_training_data_reports_an_empty_result_at_once(model) -> None:
    from device.data import Dataset
    from server.simulation.datasets import ClientData

    # Prepare: one of three clients holds no training data
    fed = synthetic(1, 1, 3, seed=3)
    ids = tuple(sorted(fed))
    empty = fed[ids[0]].train
    fed[ids[0]] = ClientData(Dataset(empty.x[:0], empty.y[:0]), fed[ids[0]].test)
    devices = VirtualDevices(fed, model)
    plan = RoundPlan(1, (GroupPlan(0, ids, "parallel", "m"),), {"m": devices.initial_weights()}, TRAIN)

    # Execute
    try:
        (result,) = devices.execute(plan, seed=0)
    finally:
        devices.close()

    # Assert: its result came (zero samples, a loss that can travel), before any deadline
    by_id = {m.client_id: m for m in result.members}
    assert set(by_id) == set(ids) and not result.skipped
    assert by_id[ids[0]].n_samples == 0 and by_id[ids[0]].train_loss == 0.0
    assert devices.bus.now() < SIM_DEADLINE_S


def test_in_delta_runs_a_device_keeps_only_the_model_the_server_may_name(model) -> None:
    # Prepare: an int8 run, two rounds over different members
    fed = synthetic(1, 1, 6, seed=3)
    ids = tuple(sorted(fed))
    devices = VirtualDevices(fed, model, codec="int8")
    start = devices.initial_weights()

    # Execute
    try:
        for rnd, members in ((1, ids[:4]), (2, ids[2:])):
            plan = RoundPlan(rnd, (GroupPlan(0, members, "parallel", "m"),), {"m": start}, TRAIN)
            devices.execute(plan, seed=0)
        assert devices.downlinks is not None
        held = {d: set(devices.bus.devices[d].waiting.held) for d in devices.bus.devices}
        named = {d: devices.downlinks.base_of(d) for d in devices.bus.devices}
    finally:
        devices.close()

    # Assert: every device holds at most the model a delta may be sent against
    assert set(held) == set(ids)
    for d in ids:
        assert held[d] <= ({named[d]} if named[d] is not None else set()), d
    assert any(held.values())  # the members of round 2 hold what they trained from


def test_views_of_one_model_go_to_worker_processes_once() -> None:
    from server.simulation.pool import _same_values

    model = np.arange(100_000, dtype=np.float32)
    views = [model.reshape(-1), model[:], model.view()]
    assert len({_same_values(v) for v in views}) == 1  # as devices decode one shared model
    assert _same_values(model.copy()) != _same_values(model)
    assert _same_values(model[:50_000]) != _same_values(model)
