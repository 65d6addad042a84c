"""One typed model of a run's learning settings, filled one way for ``covey simulate``
and ``covey server run`` (server/run_config.py, covey/learning_flags.py): the same
preset, config file and flags give both commands the same settings, with the same
sources in the results, and the server says which simulation-only settings it left out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from covey.cli import build_parser
from covey.server_commands import _learning
from covey.simulation_commands import _simulation_config
from server.coordinator.config import CoordinatorConfig
from server.run_config import RunConfig, resolve_run
from server.serve import ServeOptions, prepare_serve
from server.settings import Source

CONFIG = """
[simulation]
rounds = 3
seed = 5
codec = "int8"
workers = 1

[dataset]
name = "synthetic"
users = 20

[train]
batch = 7

[strategy]
name = "fedavg"
clients_per_round = 4

[screening]
aggregation = "median"
"""


def server_args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["server", "run", "--min-devices", "4", *argv])


def test_a_simulation_config_file_gives_server_run_the_same_learning_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the file a user simulated with, and one flag over it in both commands
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    flags = ["--config", str(config), "--rounds", "2"]

    # Execute
    on_boards = _learning(server_args(*flags))
    simulated = _simulation_config(build_parser().parse_args(["simulate", *flags]))

    # Assert: one model, the same values and the same sources
    assert isinstance(on_boards, RunConfig) and type(on_boards) is RunConfig
    # the model: the file names a data set and no model, so both train that data set's
    assert replace(on_boards, model=None) == simulated.learning() and on_boards.model == simulated.model_name
    assert on_boards.origins["model"] == (Source.CONFIG, str(config))
    assert (on_boards.strategy, on_boards.rounds, on_boards.seed, on_boards.codec) == ("fedavg", 2, 5, "int8")
    assert (on_boards.batch, on_boards.aggregation) == (7, "median")
    assert on_boards.strategy_params == {"clients_per_round": 4}
    assert on_boards.origins["rounds"] == (Source.FLAG, "command line")
    assert on_boards.origins["seed"] == (Source.CONFIG, str(config))
    assert {k: v for k, v in on_boards.origins.items() if k != "model"} == simulated.learning().origins
    # the data set and the workers are the simulator's: the server names them and goes on
    out = capsys.readouterr().out
    assert "left out (simulation only; each board trains on its own data): dataset, dataset.users, workers" in out


def test_a_preset_sets_the_server_runs_method_model_and_training() -> None:
    # Execute
    learning = _learning(server_args("--preset", "fedgsp-femnist", "--seed", "3"))

    # Assert: the paper's settings, marked as the preset's; the flag wins where given
    assert (learning.strategy, learning.model, learning.rounds, learning.batch) == ("fedgsp", "cnn_femnist", 100, 5)
    assert learning.strategy_params == {"growth": "log", "alpha": 2.0, "beta": 2, "kappa": 0.3}
    assert learning.origins["batch"] == (Source.PRESET, "fedgsp-femnist")
    assert learning.origins["strategy.kappa"] == (Source.PRESET, "fedgsp-femnist")
    assert learning.seed == 3 and learning.origins["seed"][0] is Source.FLAG


def test_without_preset_or_file_server_run_keeps_its_defaults() -> None:
    learning = _learning(server_args())
    assert (learning.strategy, learning.model, learning.rounds, learning.federated_eval_every) == (
        "fedgsp",
        "mlp_femnist",
        50,
        1,
    )
    assert learning.origins == {}


def test_the_recorded_settings_say_who_set_each_and_the_coordinator_takes_them(tmp_path: Path) -> None:
    # Prepare: a codec, an evaluation schedule and screening off, set as by a config file
    learning = RunConfig(strategy="fedgsp", rounds=3).with_overrides(
        Source.CONFIG, "run.toml", codec="int4", federated_eval_every=5, screening=False, seed=9
    )
    opts = ServeOptions(
        CoordinatorConfig("r", "127.0.0.1", 1883, tmp_path / "state"),
        learning,
        model_path=tmp_path / "mlp_femnist.tflite",
        min_devices=10,
    )

    # Execute
    prepared = prepare_serve(opts)

    # Assert
    settings = prepared.settings
    assert settings["codec"].value == "int4" and settings["codec"].source is Source.CONFIG
    assert settings["federated_eval_every"].value == 5 and settings["federated_eval_every"].detail == "run.toml"
    assert settings["rounds"].value == 3 and settings["rounds"].source is Source.DEFAULT
    assert settings["train.batch"].source is Source.PAPER
    c = prepared.options.coordinator
    assert (c.codec, c.federated_eval_every, c.seed) == ("int4", 5, 9)
    assert c.screening is not None and c.screening.norm_factor is None  # screening off reaches the round driver


def test_a_flag_beats_the_files_clients_per_round_in_both_commands(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)  # [strategy] clients_per_round = 4
    flags = ["--config", str(config), "--clients-per-round", "8"]
    for learning in (
        _learning(server_args(*flags)),
        _simulation_config(build_parser().parse_args(["simulate", *flags])),
    ):
        resolved = resolve_run(learning)
        assert resolved.params["clients_per_round"] == 8
        assert resolved.settings["strategy.clients_per_round"].source is Source.FLAG


def test_a_model_path_is_recorded_as_the_flag_that_gave_it(tmp_path: Path) -> None:
    model = tmp_path / "mine.tflite"
    learning = _learning(server_args("--preset", "fedgsp-femnist", "--model-path", str(model)))
    assert learning.model == "mine" and learning.origins["model"] == (Source.FLAG, str(model))
