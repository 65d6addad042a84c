"""The coordinator's checkpoints (server/coordinator/persistence.py): a resumed run gets
back its round, records, strategy (configured with this run's aggregation setting) and
screening history; a tampered history is refused with a clear error."""

from __future__ import annotations

import json

import pytest

from device.errors import ConfigError
from server.coordinator import checkpoint
from server.coordinator.persistence import Persistence
from server.coordinator.registry import Registry
from server.screening import ScreeningConfig
from server.simulation.datasets import synthetic
from server.simulation.engine import Simulation
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.01)


def _sim(model, screening: ScreeningConfig | None = None) -> Simulation:  # type: ignore[no-untyped-def]
    strategy = make_strategy("naivegsp", train=TRAIN, beta=2, kappa=1.0)
    return Simulation(strategy, synthetic(1, 1, 12, seed=2), model, seed=3, screening=screening or ScreeningConfig())


def test_resume_restores_the_round_the_strategy_and_the_screening_history(zoo_model, tmp_path) -> None:
    # Prepare: two rounds, checkpointed
    model = zoo_model("mclr_synthetic")
    a = _sim(model)
    a.step()
    a.step()
    Persistence(tmp_path, a.driver, Registry(10)).checkpoint()

    # Execute: a fresh run in the same folder, with another aggregation setting
    b = _sim(model, ScreeningConfig(aggregation="median"))
    resumed = Persistence(tmp_path, b.driver, Registry(10)).resume()

    # Assert
    assert resumed is not None and resumed.done == 2 and resumed.plan is None
    assert b.driver.rnd == 2 and [r.round for r in b.driver.records] == [1, 2]
    assert b.driver.screening_history() == a.driver.screening_history()
    assert any(a.driver.screening_history().values())
    assert b.driver.strategy is not a.driver.strategy and b.driver.strategy.aggregation == "median"


@pytest.mark.parametrize("history", [{"member": [["x"]]}, {"member": [[-1.0]]}, {"member": "1.0"}, [1.0]])
def test_a_tampered_screening_history_is_refused(zoo_model, tmp_path, history: object) -> None:
    model = zoo_model("mclr_synthetic")
    a = _sim(model)
    a.step()
    Persistence(tmp_path, a.driver, Registry(10)).checkpoint()
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    entries = doc["state"]["__dict__"]  # the state as checkpoint.py encodes it: [key, value] pairs
    (entry,) = [e for e in entries if e[0] == "screening_history"]
    entry[1] = checkpoint._Encoder().encode(history)
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))

    with pytest.raises(ConfigError, match="screening history"):
        Persistence(tmp_path, _sim(model).driver, Registry(10)).resume()
