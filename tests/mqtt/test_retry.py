"""A round whose sampled boards all miss their deadline is planned again with others
instead of ending the run ("no client returned a model this round")."""

from __future__ import annotations

import numpy as np
import pytest

from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import ClientInfo, TrainConfig
from tests.mqtt.conftest import femnist_root, register_silent_device

pytestmark = [pytest.mark.broker, pytest.mark.slow]
REAL = [f"dev{i:03d}" for i in range(4)]
SILENT = [f"zombie{i}" for i in range(4)]
TRAIN = TrainConfig(1, 10, 0.01)


def _seed_that_samples_only_silent_devices_first() -> int:
    """A seed whose round-1 FedAvg plan (2 of the 8) holds two silent devices, and whose
    plan without them holds a real one: found by running the strategy offline."""
    infos = [ClientInfo(c, 1, np.ones(62), 0) for c in sorted(REAL + SILENT)]
    for seed in range(200):
        strategy = make_strategy("fedavg", train=TRAIN, clients_per_round=2)
        strategy.setup(infos, np.zeros(1, np.float32), np.random.default_rng(seed))
        first = strategy.plan_round(1, None)  # type: ignore[arg-type]
        strategy.unavailable = frozenset(first.participants)
        second = strategy.plan_round(1, None)  # type: ignore[arg-type]
        if set(first.participants) <= set(SILENT) and set(second.participants) & set(REAL):
            return seed
    raise AssertionError("no such seed")


def test_a_round_of_silent_boards_is_retried_with_others_and_the_run_finishes(broker, femnist_eval, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare: four agents and four devices that joined but never train
    run, root = "retry", femnist_root()
    seed = _seed_that_samples_only_silent_devices_first()
    with start_fleet(
        root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path / "logs"
    ):
        coord = Coordinator(
            CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", deadline_s=6.0, seed=seed),
            make_strategy("fedavg", train=TRAIN, clients_per_round=2),
            ensure_model("mlp_femnist"),
            femnist_eval,
        )
        coord.connect()
        zombies = [register_silent_device(broker, run, z) for z in SILENT]
        coord.wait_for_devices(8, timeout=120)
        coord.setup_strategy()
        start = coord.strategy.global_weights.copy()

        # Execute
        records = [coord.step() for _ in range(2)]
        coord.stop_devices()
        for z in zombies:
            z.close()
        coord.close()

    # Assert: round 1 was planned twice and trained real devices; the run went on
    first = records[0]
    assert first.extra["retries"] == 1 and first.extra["retry_excluded"] == 2
    assert first.trained >= 1 and "failed_round" not in first.extra
    assert not np.array_equal(coord.strategy.global_weights, start)
    assert [r.round for r in records] == [1, 2]
