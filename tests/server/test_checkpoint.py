"""Checkpoints round-trip every strategy's state and the screening history without
pickle, and refuse foreign ones."""

from __future__ import annotations

import json

import numpy as np
import pytest

from device.errors import ConfigError
from server.coordinator import checkpoint
from server.simulation.datasets import synthetic
from server.simulation.engine import Simulation
from server.strategies import make_strategy, strategy_names
from server.strategies.base import TrainConfig
from tests.server.strategies.test_strategies import SETTINGS

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.01)


@pytest.mark.parametrize("name", strategy_names())
def test_strategy_state_round_trips_and_training_continues_identically(zoo_model, tmp_path, name: str) -> None:
    fed = synthetic(1, 1, 20, seed=2)
    params = {k: v for k, v in SETTINGS[name].items()}
    a = Simulation(make_strategy(name, train=TRAIN, **params), fed, zoo_model("mclr_synthetic"), seed=3)
    a.step()
    a.step()
    checkpoint.save({"round": 2, "strategy": a.strategy, "screening": a.driver.screening_history()}, tmp_path)
    restored = checkpoint.load(tmp_path)
    assert restored is not None and restored["round"] == 2

    # a fresh engine, as after a restart, continues with the restored strategy and screens
    # against the same reference (the accepted norms of the last rounds)
    b = Simulation(
        make_strategy(name, train=TRAIN, **params), synthetic(1, 1, 20, seed=2), zoo_model("mclr_synthetic"), seed=3
    )
    b.strategy = b.driver.strategy = restored["strategy"]
    b.driver.resume(2, [], a.driver.model_bytes, restored["screening"])
    b.devices.seen = set(a.devices.seen)
    ra, rb = a.step(), b.step()
    assert ra.federated_accuracy == rb.federated_accuracy
    np.testing.assert_array_equal(a.strategy.global_weights, b.strategy.global_weights)


def test_foreign_or_broken_checkpoints_are_refused(tmp_path) -> None:
    checkpoint.save({"x": np.arange(3)}, tmp_path)
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    doc["state"] = {"__obj__": "os:system", "state": {"__dict__": []}}
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="outside covey"):
        checkpoint.load(tmp_path)
    # arrays that do not match the JSON's digest: refused, not mixed
    checkpoint.save({"x": np.arange(3)}, tmp_path)
    (arrays,) = tmp_path.glob("checkpoint-*.npz")
    data = arrays.read_bytes()
    arrays.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(ConfigError, match="does not belong"):
        checkpoint.load(tmp_path)
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    (tmp_path / "checkpoint.json").write_text(json.dumps({**doc, "arrays": "../../etc/passwd"}))
    with pytest.raises(ConfigError, match="not a file name"):
        checkpoint.load(tmp_path)
    (tmp_path / "checkpoint.json").write_text("{broken")
    with pytest.raises(ConfigError, match="cannot be read"):
        checkpoint.load(tmp_path)
    assert checkpoint.load(tmp_path / "nowhere") is None


def test_a_crash_between_the_two_renames_leaves_the_last_whole_checkpoint(tmp_path) -> None:
    # Prepare: checkpoint 1 saved; checkpoint 2's arrays renamed in place, its JSON not yet
    checkpoint.save({"x": np.arange(3)}, tmp_path)
    checkpoint.save({"x": np.arange(4)}, tmp_path / "next")
    (newer,) = (tmp_path / "next").glob("checkpoint-*.npz")
    newer.rename(tmp_path / newer.name)

    # Execute
    state = checkpoint.load(tmp_path)

    # Assert: the old checkpoint, whole; the next save removes the orphaned arrays
    assert state is not None and list(state["x"]) == [0, 1, 2]
    checkpoint.save({"x": np.arange(5)}, tmp_path)
    assert len(list(tmp_path.glob("checkpoint-*.npz"))) == 1
    checkpoint.remove(tmp_path, "checkpoint")
    assert not list(tmp_path.glob("checkpoint*"))
