"""Poisoning over MQTT: one of eight agents, a process of its own, boosts every update
x100 (FedAvg on FEMNIST writers). With screening on, the poisoner's updates are refused
and counted every round, no honest one is, the final server-side accuracy stays within 2
points of the clean run with the same seed, and the board run gives the same model as
the screened simulation: boards and virtual devices screen alike. (What screening off
costs, and the clean run itself, are the simulation's to show, equal to boards:
``tests/server/simulation/test_poisoning.py``, ``tests/mqtt/test_equivalence.py``.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from server.lab.poisoning import POISONER, on_boards, simulate
from server.screening import ScreeningConfig
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
SCRIPT = Path(__file__).with_name("poisoning_agent.py")
TRAIN = TrainConfig(epochs=3, batch_size=10, lr=0.003)  # a smooth regime: one writer less moves little
DEVICES, ROUNDS, SEED, SCALE = 8, 20, 3, 100.0


def _fedavg():  # type: ignore[no-untyped-def]
    return make_strategy("fedavg", train=TRAIN, clients_per_round=DEVICES)


def test_one_poisoner_in_eight_is_screened_out_on_boards_as_in_simulation(broker, femnist_eval, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare
    common = {"root": femnist_root(), "model_path": ensure_model("mlp_femnist"), "eval_data": femnist_eval}
    boards = {**common, "scale": SCALE, "host": broker.host, "port": broker.port, "rounds": ROUNDS}
    runs = {"n_devices": DEVICES, "seed": SEED}

    # Execute
    screened = on_boards(
        _fedavg, **boards, **runs, screening=ScreeningConfig(), poisoner_script=SCRIPT, work=tmp_path / "s", run="p-on"
    )
    sim = {**common, "rounds": ROUNDS, **runs, "screening": ScreeningConfig()}
    clean, simulated = simulate(_fedavg, **sim, scale=None), simulate(_fedavg, **sim, scale=SCALE)

    # Assert: screened, the poisoner changes the final accuracy by less than 2 points
    drop = 100 * (clean.final_accuracy - screened.final_accuracy)
    shown = f"clean {clean.final_accuracy:.1%}, screened {screened.final_accuracy:.1%}"
    print(f"server accuracy after {ROUNDS} rounds: {shown}")
    assert abs(drop) < 2.0, drop
    assert screened.rejected == {POISONER: ROUNDS}  # every poisoned update refused, and only those
    assert all(r.dropped.get("screened: update norm") == 1 and r.trained == DEVICES for r in screened.records)
    assert float(np.max(np.abs(screened.weights - simulated.weights))) <= 1e-5  # screened alike
