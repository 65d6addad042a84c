"""Faults against real mosquitto, the real coordinator process and agent processes.

Each run is FedGSP with direct hand-offs (chains, the most fragile path), one fault
in the middle of round 2. Every run must finish all rounds, lose no contribution a
device trained, and stay within 2 points of the undisturbed run with the same seed;
where no device was out of reach for a deadline, the final model is the undisturbed
run's model exactly (nothing lost, nothing counted twice).
"""

from __future__ import annotations

import numpy as np
import pytest

from server.lab.process_faults import FaultRun, run_with_fault
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROUNDS = 3


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    from covey.paths import ensure_model

    return ensure_model("mlp_femnist")


@pytest.fixture(scope="module")
def undisturbed(model, tmp_path_factory) -> FaultRun:  # type: ignore[no-untyped-def]
    run = run_with_fault(
        "none", root=femnist_root(), model_path=model, work=tmp_path_factory.mktemp("none"), rounds=ROUNDS
    )
    assert run.finished, run.detail
    return run


@pytest.mark.parametrize("fault", ["broker_restart", "coordinator_kill", "flaky_connection", "duplicates"])
def test_a_fault_loses_nothing_and_the_model_is_the_undisturbed_one(fault, model, undisturbed, tmp_path) -> None:
    # Execute
    run = run_with_fault(fault, root=femnist_root(), model_path=model, work=tmp_path, rounds=ROUNDS)

    # Assert
    assert run.finished, run.detail
    assert run.lost == 0
    assert all(r["skipped"] == 0 for r in run.rounds), [r["skipped"] for r in run.rounds]
    assert run.weights is not None and undisturbed.weights is not None
    assert float(np.max(np.abs(run.weights - undisturbed.weights))) <= 1e-5
    assert abs(run.accuracy - undisturbed.accuracy) <= 0.02


def test_a_device_killed_mid_chain_is_skipped_and_the_run_finishes(model, undisturbed, tmp_path) -> None:
    run = run_with_fault("device_kill", root=femnist_root(), model_path=model, work=tmp_path, rounds=ROUNDS)

    assert run.finished, run.detail
    assert run.lost == 0  # what it trained before the kill was held and delivered after the reboot
    assert abs(run.accuracy - undisturbed.accuracy) <= 0.02
    assert all(len(r["trained_ids"]) >= 4 for r in run.rounds)  # at most the killed device's round is missing
