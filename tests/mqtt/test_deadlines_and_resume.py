"""Deadlines skip a silent device without losing the chain's model; checkpoints resume;
devices evaluate the model on their own test sets."""

from __future__ import annotations

import numpy as np
import pytest

from device.transport import Link
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import GroupPlan, RoundPlan, TrainConfig
from tests.mqtt.conftest import femnist_root, loopback_fleet, register_silent_device, where

pytestmark = [pytest.mark.slow]
TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.01)


def _register_ghost(broker, run: str) -> Link:  # type: ignore[no-untyped-def]
    """A device that registers, answers its confirmation ping, and then never answers."""
    return register_silent_device(broker, run, "ghost")


@pytest.mark.parametrize("handoff", ["direct", "relay"])
@pytest.mark.parametrize("ghost_position", [0, 2])
def test_a_silent_device_is_skipped_and_the_chain_goes_on(femnist_eval, tmp_path, handoff, ghost_position) -> None:
    """On the loopback broker: the coordinator's and the agents' own code, in this process."""
    from covey.paths import ensure_model

    root = femnist_root()
    run = f"ghost-{handoff}-{ghost_position}"
    with loopback_fleet(root, leaf_writers(root, 4), run=run, state_dir=tmp_path / "agents") as broker:
        host, port, link = where(broker)
        strategy = make_strategy("fedgsp", train=TRAIN, beta=1, kappa=1.0, growth="linear", alpha=0.0)
        coord = Coordinator(
            CoordinatorConfig(run, host, port, tmp_path / "state", handoff=handoff, deadline_s=6.0),
            strategy,
            ensure_model("mlp_femnist"),
            femnist_eval,
            **link,
        )
        coord.connect()
        ghost = _register_ghost(broker, run)
        coord.wait_for_devices(5, 120)
        coord.setup_strategy()
        members = [f"dev{i:03d}" for i in range(4)]
        members.insert(ghost_position, "ghost")
        start = strategy.global_weights.copy()
        plan = RoundPlan(1, (GroupPlan(0, tuple(members), "chain", "global"),), {"global": start}, TRAIN)
        coord.round = 1
        (result,) = coord.backend.execute(plan, seed=0)
        coord.stop_devices()
        ghost.close()
        coord.close()

    assert result.skipped == ("ghost",)
    assert [m.client_id for m in result.members] == [m for m in members if m != "ghost"]
    assert result.final_weights is not None
    assert not np.array_equal(result.final_weights, start)  # the four real devices' work survived


@pytest.mark.broker
def test_coordinator_resumes_from_its_checkpoint_and_devices_evaluate(broker, femnist_eval, tmp_path) -> None:
    from covey.paths import ensure_model

    root = femnist_root()
    run = "resume"
    model = ensure_model("mlp_femnist")
    config = CoordinatorConfig(
        run, broker.host, broker.port, tmp_path / "state", deadline_s=60.0, federated_eval_every=1
    )
    with start_fleet(
        root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path / "logs"
    ):
        first = Coordinator(config, make_strategy("fedavg", train=TRAIN, clients_per_round=4), model, femnist_eval)
        first.connect()
        first.wait_for_devices(4, 120)
        first.setup_strategy()
        first.step()
        first.step()
        weights = first.strategy.global_weights.copy()
        history = first.driver.screening_history()
        first.close()  # the server "crashes" after round 2

        second = Coordinator(config, make_strategy("fedavg", train=TRAIN, clients_per_round=4), model, femnist_eval)
        second.connect()
        assert second.resume()
        assert second.round == 2
        # what results.json and the dashboard say happened to the run
        assert second.run_events == [{"round": 3, "kind": "resumed", "detail": "from the checkpoint after round 2"}]
        np.testing.assert_array_equal(second.strategy.global_weights, weights)
        assert second.driver.screening_history() == history  # screened against the same reference
        assert any(history.values())
        second.wait_for_devices(4, 60)
        metrics = second.step()
        second.stop_devices()
        second.close()

    assert metrics.round == 3 and metrics.trained == 4
    assert [m.round for m in second.records] == [1, 2, 3]
    assert 0 < metrics.federated_accuracy <= 1


@pytest.mark.broker
def test_a_new_coordinator_on_the_standing_broker_adopts_the_devices(broker, femnist_eval, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare: a coordinator runs a round and goes away without stopping the devices
    root, run = femnist_root(), "adopt"
    model = ensure_model("mlp_femnist")
    with start_fleet(root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        first = Coordinator(
            CoordinatorConfig(run, broker.host, broker.port, tmp_path / "a", deadline_s=60.0),
            make_strategy("fedavg", train=TRAIN, clients_per_round=4),
            model,
            femnist_eval,
        )
        first.connect()
        first.wait_for_devices(4, 120)
        first.setup_strategy()
        first.step()
        first.close()

        # Execute: a new coordinator with a fresh state folder (no --resume) on the same run
        second = Coordinator(
            CoordinatorConfig(run, broker.host, broker.port, tmp_path / "b", deadline_s=60.0),
            make_strategy("fedavg", train=TRAIN, clients_per_round=4),
            model,
            femnist_eval,
        )
        second.connect()
        second.wait_for_devices(4, 30)  # the agents saw a new epoch and registered again
        second.setup_strategy()
        record = second.step()
        second.stop_devices()
        second.close()

    # Assert
    assert sorted(second.devices) == ["dev000", "dev001", "dev002", "dev003"]
    assert record.trained == 4 and record.skipped == 0
