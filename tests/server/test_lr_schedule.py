"""A learning-rate schedule for every strategy (issue 29): round ``r`` trains with
``lr * lr_decay ** (r - 1)``, applied once, by the round driver that simulations and
boards share, and recorded with the run's settings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from covey.cli import main
from server.errors import StrategyError
from server.rounds import RoundDriver
from server.settings import Source, resolve_training
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.covey.test_cli_mistakes import assert_one_line_error, covey
from tests.server.test_retry import FakeDevices


def test_each_round_trains_with_its_decayed_rate_retries_included() -> None:
    # Prepare: FedAvg over 8 devices, η = 0.1 halved each round, and round 1's first
    # three sampled devices silent (the retry is still round 1)
    probe = RoundDriver(
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.1, lr_decay=0.5), clients_per_round=3),
        FakeDevices(set()),
        seed=3,
        federated_eval_every=0,
    )
    probe.setup(np.zeros(6, np.float32))
    probe.step()
    dead = set(probe.backend.plans[0].participants)  # type: ignore[attr-defined]
    devices = FakeDevices(dead)
    strategy = make_strategy("fedavg", train=TrainConfig(1, 10, 0.1, lr_decay=0.5), clients_per_round=3)
    driver = RoundDriver(strategy, devices, seed=3, federated_eval_every=0)
    driver.setup(np.zeros(6, np.float32))

    # Execute
    for _ in range(3):
        driver.step()

    # Assert: 0.1 in round 1 (both plans), 0.05, 0.025; a plan carries its round's rate
    # alone, and the strategy's own settings are untouched
    assert [p.round for p in devices.plans] == [1, 1, 2, 3]
    assert [p.train.lr for p in devices.plans] == pytest.approx([0.1, 0.1, 0.05, 0.025])
    assert all(p.train.lr_decay == 1.0 for p in devices.plans)
    assert strategy.train.lr == 0.1 and strategy.train.lr_decay == 0.5


def test_a_decay_outside_0_to_1_is_refused() -> None:
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(StrategyError, match="lr_decay must be in"):
            TrainConfig(lr_decay=bad)
    proc = covey("simulate", "--strategy", "fedavg", "--lr-decay", "1.5", "--rounds", "1")
    assert_one_line_error(proc, "lr_decay must be a number in (0, 1]")


def test_the_schedule_is_recorded_with_where_it_came_from(tmp_path: Path) -> None:
    # Execute: FedAvg-IC with its paper's training, and FedAvg with the flag
    runs = {"fedavg_ic": ("--set", "n_groups=2"), "fedavg": ("--lr-decay", "0.9")}
    for strategy, extra in runs.items():
        argv = ["simulate", "--strategy", strategy, "--rounds", "2", "--federated-eval-every", "0", *extra]
        assert main([*argv, "--out", str(tmp_path / strategy)]) == 0

    # Assert: Table 4's 0.99 from the paper; the flag's 0.9 from the command line
    settings = {
        s: json.loads(next((tmp_path / s).glob("*.json")).read_text())["settings"] for s in ("fedavg_ic", "fedavg")
    }
    assert settings["fedavg_ic"]["train.lr_decay"]["value"] == 0.99
    assert settings["fedavg_ic"]["train.lr_decay"]["source"] == "paper"
    assert settings["fedavg_ic"]["train.batch"]["value"] == 128
    assert settings["fedavg"]["train.lr_decay"] == {"value": 0.9, "source": "flag", "detail": "command line"}


def test_a_paper_without_a_schedule_leaves_the_decay_at_covey_s_default() -> None:
    # FedGSP's paper sets its training but no schedule; FedAvg-IC's Table 4 sets 0.99
    _, fedgsp = resolve_training("fedgsp", {})
    _, fedavg_ic = resolve_training("fedavg_ic", {})
    assert (fedgsp["train.lr_decay"].value, fedgsp["train.lr_decay"].source) == (1.0, Source.DEFAULT)
    assert fedgsp["train.batch"].source == Source.PAPER
    assert (fedavg_ic["train.lr_decay"].value, fedavg_ic["train.lr_decay"].source) == (0.99, Source.PAPER)
