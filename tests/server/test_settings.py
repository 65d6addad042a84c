"""A method's paper settings reach the devices unless the user sets a value, and the
result file says where every effective setting came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import server.simulation.trainer as trainer_module
from covey.cli import main
from device.protocol import LocalTraining
from server.settings import Setting, Source, resolve_strategy_params, resolve_training
from server.simulation.presets import PRESETS
from server.strategies.fedgroup import FlexCFL
from server.strategies.fedgsp import FedGSP


@pytest.fixture
def trained_with(monkeypatch) -> list[LocalTraining]:
    """Every LocalTraining a virtual device trained with (the device code's own input)."""
    seen: list[LocalTraining] = []
    real = trainer_module.train_locally

    def spy(model, data, settings, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(settings)
        return real(model, data, settings, **kwargs)

    monkeypatch.setattr(trainer_module, "train_locally", spy)
    return seen


def test_training_resolves_to_the_papers_values_unless_set() -> None:
    train, settings = resolve_training("fedgsp", {})
    assert (train.epochs, train.batch_size, train.lr) == (1, 5, 0.01)
    assert settings["train.batch"] == Setting(5, Source.PAPER, FedGSP.paper_settings)
    assert settings["train.mu"].source is Source.DEFAULT  # FedGSP's paper sets no proximal term

    train, settings = resolve_training("fedgsp", {"batch": Setting(32, Source.FLAG, "--batch")})
    assert train.batch_size == 32 and train.epochs == 1
    assert settings["train.batch"].source is Source.FLAG

    _, settings = resolve_training("fedavg", {})
    assert settings["train.batch"].source is Source.DEFAULT  # a baseline: covey's own default


def test_strategy_parameters_say_whether_a_default_is_the_papers() -> None:
    params, settings = resolve_strategy_params("fedgsp", {"beta": Setting(2, Source.FLAG, "--set")})
    assert params == {"beta": 2}
    assert settings["strategy.kappa"] == Setting(0.3, Source.PAPER, FedGSP.paper_settings)
    assert settings["strategy.beta"].source is Source.FLAG
    assert settings["strategy.icg_iterations"].source is Source.PAPER  # ICG's τ = 10, Sec. 3.3
    assert settings["strategy.icg_draw"].source is Source.DEFAULT  # the paper draws at random


@pytest.mark.slow
def test_simulate_trains_fedgsp_at_its_papers_batch_and_records_the_source(tmp_path: Path, trained_with) -> None:
    # Execute: no --batch, --epochs or --lr
    code = main(
        [
            "simulate",
            "--strategy",
            "fedgsp",
            "--data",
            "users=12",
            "--rounds",
            "1",
            "--set",
            "kappa=1.0",
            "--set",
            "beta=2",
            "--out",
            str(tmp_path),
        ]
    )

    # Assert: the devices trained at batch 5, and the file says it is the paper's value
    assert code == 0
    assert trained_with and {s.batch for s in trained_with} == {5}
    settings = json.loads((tmp_path / "fedgsp_synthetic_seed0.json").read_text())["settings"]
    assert settings["train.batch"] == {"value": 5, "source": "paper", "detail": FedGSP.paper_settings}
    assert settings["strategy.kappa"] == {"value": 1.0, "source": "flag", "detail": "command line"}
    assert settings["rounds"]["source"] == "flag"


@pytest.mark.slow
def test_a_flag_overrides_the_papers_value(tmp_path: Path, trained_with) -> None:
    args = ["simulate", "--strategy", "fedgsp", "--data", "users=12", "--rounds", "1", "--batch", "8"]
    assert main([*args, "--set", "kappa=1.0", "--out", str(tmp_path)]) == 0
    assert {s.batch for s in trained_with} == {8}
    settings = json.loads((tmp_path / "fedgsp_synthetic_seed0.json").read_text())["settings"]
    assert settings["train.batch"]["source"] == "flag"


@pytest.mark.slow
def test_the_flexcfl_preset_trains_ten_epochs(tmp_path: Path, trained_with, capsys) -> None:
    # Execute: the preset, made small by flags (which override it)
    code = main(
        [
            "simulate",
            "--preset",
            "flexcfl-synthetic",
            "--rounds",
            "1",
            "--data",
            "users=20",
            "--set",
            "alpha=1",
            "--set",
            "pretrain_steps=5",
            "--out",
            str(tmp_path),
        ]
    )

    # Assert
    assert code == 0
    assert {s.epochs for s in trained_with} == {10} and {s.batch for s in trained_with} == {10}
    settings = json.loads((tmp_path / "flexcfl_synthetic_seed0.json").read_text())["settings"]
    assert settings["train.epochs"] == {"value": 10, "source": "preset", "detail": "flexcfl-synthetic"}
    assert settings["strategy.n_groups"]["source"] == "preset"
    assert settings["dataset.users"] == {"value": 20, "source": "flag", "detail": "command line"}
    assert settings["dataset.alpha"]["source"] == "preset"
    out = capsys.readouterr().out
    assert "departs:" in out and "FlexCFL Table 3" in out  # what the preset changes from the paper, and why
    assert "the paper reports 85.6 %" in out


@pytest.mark.slow
def test_a_config_file_overrides_the_preset_and_a_flag_the_file(tmp_path: Path, trained_with) -> None:
    config = tmp_path / "run.toml"
    config.write_text("[train]\nepochs = 2\nbatch = 4\n[dataset]\nusers = 20\n")
    code = main(
        [
            "simulate",
            "--preset",
            "flexcfl-synthetic",
            "--config",
            str(config),
            "--batch",
            "6",
            "--rounds",
            "1",
            "--set",
            "alpha=1",
            "--set",
            "pretrain_steps=5",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert {(s.epochs, s.batch) for s in trained_with} == {(2, 6)}
    settings = json.loads((tmp_path / "flexcfl_synthetic_seed0.json").read_text())["settings"]
    assert settings["train.epochs"] == {"value": 2, "source": "config file", "detail": str(config)}
    assert settings["train.batch"]["source"] == "flag"


def test_every_preset_names_its_paper_departures_and_valid_parameters() -> None:
    from server.strategies import strategy_parameters

    for p in PRESETS.values():
        assert p.departures and p.paper and p.reported
        for strategy in (p.strategy, *p.reported):
            assert set(p.params_for(strategy)) <= strategy_parameters(strategy), (p.name, strategy)


def test_covey_presets_lists_them(capsys) -> None:
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in PRESETS)
    assert FlexCFL.paper_train.epochs == 10
