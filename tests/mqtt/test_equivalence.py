"""The one round driver: the same seed and plan give the same models in simulation and
over real mosquitto with agent processes (FedAvg, FedGSP with direct and relay
hand-offs, IFCA)."""

from __future__ import annotations

import pytest

from server.equivalence import run_both
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
TRAIN = TrainConfig(epochs=1, batch_size=5, lr=0.01)
CASES = {
    "fedavg": ("direct", lambda: make_strategy("fedavg", train=TRAIN, clients_per_round=4)),
    "fedgsp_direct": (
        "direct",
        lambda: make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=1.0, beta=2, kappa=1.0),
    ),
    "fedgsp_relay": (
        "relay",
        lambda: make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=1.0, beta=2, kappa=1.0),
    ),
    "ifca": ("direct", lambda: make_strategy("ifca", train=TRAIN, n_groups=2, clients_per_round=4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulation_and_boards_give_the_same_models(broker, tmp_path, case: str) -> None:
    from covey.paths import ensure_model

    # Prepare
    handoff, make = CASES[case]

    # Execute
    result = run_both(
        make,
        root=femnist_root(),
        model_path=ensure_model("mlp_femnist"),
        host=broker.host,
        port=broker.port,
        work=tmp_path,
        run=f"eq-{case.replace('_', '')}",
        rounds=3,
        handoff=handoff,
    )

    # Assert
    assert result.max_abs_diff <= 1e-5, result.max_abs_diff
    assert result.accuracy_diff <= 1e-9
    assert [r.federated_accuracy for r in result.sim] == pytest.approx([r.federated_accuracy for r in result.mqtt])
    assert all(r.trained == r.participants and r.skipped == 0 for r in result.mqtt)
    if case.startswith("fedgsp"):
        assert all(r.handoff == {handoff: r.n_groups} for r in result.mqtt)
