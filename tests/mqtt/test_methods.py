"""Every grouping method runs on boards: covey's coordinator and agents, in this process
over the loopback broker (the same code as over mosquitto, which
``test_equivalence.py`` holds bit for bit to the simulator); FlexCFL's newcomer and
migration over a real mosquitto with agent processes that stop and start."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.loopback import LoopbackBroker
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root, loopback_fleet

pytestmark = [pytest.mark.slow]
TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.01)


def _coordinator(broker, eval_data, tmp: Path, run: str, strategy) -> Coordinator:  # type: ignore[no-untyped-def]
    """A connected coordinator on ``broker``: mosquitto's handle, or a LoopbackBroker."""
    from covey.paths import ensure_model

    loopback = isinstance(broker, LoopbackBroker)
    coord = Coordinator(
        CoordinatorConfig(
            run,
            "loopback" if loopback else broker.host,
            0 if loopback else broker.port,
            tmp / run,
            deadline_s=60.0,
            seed=1,
        ),
        strategy,
        ensure_model("mlp_femnist"),
        eval_data,
        **({"link_factory": broker.link} if loopback else {}),
    )
    coord.connect()
    return coord


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("dsc", {"clients_per_round": 6}),
        ("fedgroup", {"n_groups": 2, "clients_per_round": 6, "alpha": 3, "pretrain_steps": 10}),
        ("fedavg_ic", {"n_groups": 2, "tau1": 10, "tau2": 2}),  # round 3 ends with a global aggregation
        ("ifca", {"n_groups": 2, "clients_per_round": 6}),
    ],
)
def test_method_runs_on_boards(femnist_eval, tmp_path, name: str, params: dict) -> None:  # type: ignore[type-arg]
    root = femnist_root()
    run = f"m-{name.replace('_', '')}"
    with loopback_fleet(root, leaf_writers(root, 6), run=run, state_dir=tmp_path / "agents") as broker:
        coord = _coordinator(broker, femnist_eval, tmp_path, run, make_strategy(name, train=TRAIN, **params))
        coord.wait_for_devices(6, 120)
        coord.measure_rtt()
        coord.setup_strategy()
        metrics = [coord.step() for _ in range(3)]
        coord.stop_devices()
        coord.close()

    assert all(m.trained == m.participants > 0 and not m.dropped for m in metrics)
    assert metrics[-1].server_loss < metrics[0].server_loss  # learning (accuracy wobbles in 3 rounds of 6 writers)
    assert metrics[-1].server_accuracy > 2 / 62
    if name == "fedavg_ic":
        assert coord.backend.distance_matrix() is not None  # grouped with measured RTTs
        assert len(coord.strategy.group_models) == 2


@pytest.mark.broker
def test_flexcfl_over_mqtt_with_a_newcomer_and_a_migration(broker, femnist_eval, tmp_path) -> None:
    root = femnist_root()
    run = "m-flexcfl"
    writers = leaf_writers(root, 8)
    strategy = make_strategy(
        "flexcfl", train=TRAIN, n_groups=2, clients_per_round=5, alpha=2, pretrain_steps=10, warmup="none"
    )
    first = [f"dev{i:03d}" for i in range(5)]
    with start_fleet(
        root, writers[:5], run=run, host=broker.host, port=broker.port, log_dir=tmp_path / "a", device_ids=first
    ) as fleet:
        coord = _coordinator(broker, femnist_eval, tmp_path, run, strategy)
        coord.wait_for_devices(5, 120)
        coord.setup_strategy()
        coord.step()  # group cold start, every client selected
        assert set(strategy.assignment) == set(first)

        # a newcomer registers mid-run and is cold-started when first selected
        with start_fleet(
            root,
            [writers[5]],
            run=run,
            host=broker.host,
            port=broker.port,
            log_dir=tmp_path / "b",
            device_ids=["dev005"],
        ):
            coord.wait_for_devices(6, 120)
            # dev001 restarts holding another writer's data: its label histogram moved
            fleet.processes[1].terminate()
            fleet.processes[1].wait(10)
            moved_counts = coord.devices["dev001"].info.class_counts.copy()
            with start_fleet(
                root,
                [writers[6]],
                run=run,
                host=broker.host,
                port=broker.port,
                log_dir=tmp_path / "c",
                device_ids=["dev001"],
            ):
                deadline = time.monotonic() + 60
                while (coord.devices["dev001"].info.class_counts == moved_counts).all() and time.monotonic() < deadline:
                    coord.pump(0.2)
                strategy.sampler.k = 6
                metrics = coord.step()
                coord.stop_devices()
        coord.close()

    assert "dev005" in strategy.assignment  # the newcomer joined a group (FedGroup Eq. 9)
    assert strategy.migrations >= 1 and metrics.extra["migrated"] >= 1  # dev001 was cold-started again
    assert metrics.trained == 6 and not metrics.dropped


@pytest.mark.broker
def test_a_board_gone_offline_is_planned_around_not_waited_for(broker, tmp_path) -> None:
    # Prepare: FedAvg asks all four boards each round; after round 1 one board's agent is
    # killed (no clean stop: the broker publishes its last will, "offline")
    root = femnist_root()
    run = "m-offline"
    strategy = make_strategy("fedavg", train=TRAIN, clients_per_round=4)
    with start_fleet(
        root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path
    ) as fleet:
        coord = _coordinator(broker, None, tmp_path, run, strategy)
        coord.wait_for_devices(4, 120)
        coord.setup_strategy()
        first = coord.step()
        fleet.processes[3].kill()
        fleet.processes[3].wait(10)
        gone = "dev003"  # the fourth agent's id (start_fleet numbers them)
        deadline = time.monotonic() + 60  # its last will, then the grace a reconnect gets
        while gone not in coord.backend.offline() and time.monotonic() < deadline:
            coord.pump(0.2)

        # Execute: a round without it
        second = coord.step()
        coord.stop_devices()
        coord.close()

    # Assert: round 1 had all four; round 2 planned the three online boards, so nobody
    # was skipped at the deadline (a planned dead board would be) and nothing retried
    assert first.trained == 4 and not coord.devices[gone].online
    assert gone not in second.trained_ids and second.participants == 3 and second.skipped == 0
    assert "retries" not in second.extra
