"""Poisoning in simulation, for several strategies: one of eight FEMNIST writers boosts
its update x100. Unscreened, the global model is wrecked; screened (the default
update-norm bound), every poisoned update is refused and the final accuracy stays near
the clean run's. Robust aggregation alone (coordinate-wise median, trimmed mean) holds
too, for parallel strategies.

FedGSP refuses the whole chain that holds the poisoner, so its honest chain partner's
work is lost too: a larger, but bounded, cost."""

from __future__ import annotations

import numpy as np
import pytest

from server.lab.poisoning import POISONER, simulate
from server.screening import ScreeningConfig
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

pytestmark = [pytest.mark.slow]
TRAIN = TrainConfig(epochs=3, batch_size=10, lr=0.003)
DEVICES, ROUNDS, SEED = 8, 20, 3
STRATEGIES = {
    "fedavg": (lambda: make_strategy("fedavg", train=TRAIN, clients_per_round=DEVICES), 2.0),
    "fedprox": (lambda: make_strategy("fedprox", train=TRAIN, clients_per_round=DEVICES, mu=0.01), 2.0),
    "ifca": (lambda: make_strategy("ifca", train=TRAIN, n_groups=2, clients_per_round=DEVICES), 2.0),
    # 4 chains of 2: the poisoner's chain is refused each round, a quarter of the data
    "fedgsp": (lambda: make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=0.0, beta=4, kappa=1.0), 5.0),
}


@pytest.fixture(scope="module")
def setting(femnist_eval):  # type: ignore[no-untyped-def]
    from covey.paths import ensure_model
    from tests.mqtt.conftest import femnist_root

    return {"root": femnist_root(), "model_path": ensure_model("mlp_femnist"), "eval_data": femnist_eval}


@pytest.fixture(scope="module")
def femnist_eval():  # type: ignore[no-untyped-def]
    from covey.paths import femnist_dir
    from device.data import Dataset, read_leaf

    test = read_leaf(femnist_dir() / "test")
    return Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))


@pytest.fixture(scope="module")
def clean_runs(setting):  # type: ignore[no-untyped-def]
    """Each strategy's clean run with the default screening, made once for the module
    (FedAvg's is the reference of three tests)."""
    runs: dict[str, object] = {}

    def clean(name: str):  # type: ignore[no-untyped-def]
        if name not in runs:
            run = {**setting, "rounds": ROUNDS, "n_devices": DEVICES, "seed": SEED}
            runs[name] = simulate(STRATEGIES[name][0], **run, screening=ScreeningConfig(), scale=None)
        return runs[name]

    return clean


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_screening_refuses_the_poisoner_and_keeps_the_accuracy(setting, clean_runs, name: str) -> None:
    # Prepare
    make, tolerance = STRATEGIES[name]
    run = {**setting, "rounds": ROUNDS, "n_devices": DEVICES, "seed": SEED}

    # Execute
    clean = clean_runs(name)
    screened = simulate(make, **run, screening=ScreeningConfig(), scale=100.0)
    unscreened = simulate(make, **run, screening=None, scale=100.0)

    # Assert
    assert abs(100 * (clean.final_accuracy - screened.final_accuracy)) < tolerance
    assert 100 * (clean.final_accuracy - unscreened.final_accuracy) > 9.0
    assert clean.rejected == {}
    assert screened.rejected[POISONER] == ROUNDS  # every poisoned update refused
    assert set(unscreened.rejected) <= {POISONER}  # screening off, the guard's bound never refuses an honest one
    if name != "fedgsp":  # a refused chain also names the poisoner's honest partner
        assert set(screened.rejected) == {POISONER}


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_robust_aggregation_alone_holds_against_the_poisoner(setting, clean_runs, rule: str) -> None:
    make, _ = STRATEGIES["fedavg"]
    run = {**setting, "rounds": ROUNDS, "n_devices": DEVICES, "seed": SEED}
    robust = ScreeningConfig(norm_factor=None, aggregation=rule)  # type: ignore[arg-type]

    clean = clean_runs("fedavg")
    poisoned = simulate(make, **run, screening=robust, scale=100.0)

    assert abs(100 * (clean.final_accuracy - poisoned.final_accuracy)) < 2.0
    assert poisoned.rejected == {}  # nothing refused: the rule outvotes the poisoner
