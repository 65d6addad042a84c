"""Simulation settings (TOML + flags) and the simulate / compare commands."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NoReturn

import pytest

from covey.cli import main
from device.errors import ConfigError
from server.simulation.config import SimulationConfig, load_config, parse_assignments
from server.simulation.threads import cpu_quota, default_workers


def test_toml_config_and_overrides(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        '[simulation]\nrounds = 7\nseed = 3\n[dataset]\nname = "synthetic"\nusers = 12\n'
        '[train]\nepochs = 2\n[strategy]\nname = "fedgsp"\nkappa = 0.5\n'
    )
    cfg = load_config(path)
    assert (cfg.rounds, cfg.seed, cfg.epochs, cfg.strategy) == (7, 3, 2, "fedgsp")
    assert cfg.dataset_params == {"users": 12} and cfg.strategy_params == {"kappa": 0.5}
    assert cfg.with_overrides(rounds=9, seed=None).rounds == 9
    assert parse_assignments(["a=1", "b=0.5", "c=true", "d=edc"]) == {"a": 1, "b": 0.5, "c": True, "d": "edc"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[simulaton]\nrounds = 3\n", "unknown section"),
        ("[simulation]\nround = 3\n", "round"),
        ('[dataset]\nname = "cifar"\n', "unknown data set"),
        ('[dataset]\nname = "synthetic"\nwriters = 3\n', "writers"),
        ("[simulation]\nrounds = 0\n", "rounds"),
        ("not = [toml", "not valid TOML"),
        ("[screening]\nnorm_factor = 0.5\n", "above 1"),
        ('[screening]\naggregation = "mode"\n', "aggregation must be one of"),
        ("[screening]\nenabled = 1\n", "screening must be true or false"),
        ("[screening]\nfactor = 3\n", "unknown \\[screening\\] key"),
        ("[simulation]\nfederated_eval_every = -1\n", "federated_eval_every must be an integer >= 0"),
        ('[simulation]\nworker_kind = "fiber"\n', "worker_kind must be one of thread, process"),
        # integers beyond a float (bench/fuzz.py found the first: OverflowError in screening_config)
        (f"[screening]\nnorm_factor = {10**400}\n", "norm_factor and trim must be numbers"),
        (f"[screening]\ntrim = {10**400}\n", "norm_factor and trim must be numbers"),
        (f"[train]\nlr = {10**400}\n", "lr"),
        (f"[simulation]\nshift_probability = {10**400}\n", "shift probability"),
    ],
)
def test_bad_config_files_are_refused(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_screening_from_a_config_file_and_flags(tmp_path) -> None:
    from server.simulation.run import prepare

    # Prepare
    path = tmp_path / "run.toml"
    path.write_text('[screening]\nenabled = true\nnorm_factor = 5\naggregation = "trimmed_mean"\ntrim = 0.1\n')

    # Execute
    from_file = load_config(path)
    flagged = from_file.with_overrides(screening=False, aggregation="median")
    default = SimulationConfig()

    # Assert
    screening = from_file.screening_config()
    assert (screening.norm_factor, screening.aggregation, screening.trim) == (5.0, "trimmed_mean", 0.1)
    assert flagged.screening_config().norm_factor is None and flagged.screening_config().aggregation == "median"
    assert default.screening_config().norm_factor == 10.0 and default.screening_config().aggregation == "mean"
    settings = prepare(from_file).settings
    assert settings["norm_factor"].value == 5 and settings["aggregation"].source.value == "config file"


def test_simulate_screening_flags_reach_the_run(tmp_path) -> None:
    code = main(
        [
            "simulate",
            "--strategy",
            "fedavg",
            "--data",
            "users=12",
            "--rounds",
            "2",
            "--set",
            "clients_per_round=4",
            "--screening",
            "off",
            "--aggregation",
            "median",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "fedavg_synthetic_seed0.json").read_text())
    assert result["settings"]["screening"] == {"value": False, "source": "flag", "detail": "command line"}
    assert result["settings"]["aggregation"]["value"] == "median"
    assert all("update_norm_max_ratio" not in r["extra"] for r in result["rounds"])  # no norm bound: not measured


def test_simulate_command_writes_results_and_a_plot(tmp_path, capsys) -> None:
    code = main(
        [
            "simulate",
            "--strategy",
            "fedgsp",
            "--dataset",
            "synthetic",
            "--data",
            "users=12",
            "--rounds",
            "3",
            "--set",
            "beta=2",
            "--set",
            "kappa=1.0",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "fedgsp_synthetic_seed0.json").read_text())
    assert len(result["rounds"]) == 3
    assert {"federated_accuracy", "median_cpd", "bytes", "t_comp_s", "t_comm_s"} <= set(result["rounds"][0])
    assert (tmp_path / "fedgsp_synthetic_seed0.png").stat().st_size > 10_000
    assert (tmp_path / "fedgsp_synthetic_seed0.csv").read_text().startswith("round,")
    # the model frames: each once as sent, and on the devices' links; with screening on
    # (the default) a chain's hand-offs are relayed through its manager, which screens
    # each (server/hops.py), so each frame crosses one device's link and none goes peer to peer
    first = result["rounds"][0]["extra"]
    assert first["wire_bytes"] == first["wire_bytes_down"] + first["wire_bytes_up"]
    assert first["wire_bytes_peer"] == 0
    assert first["wire_radio_bytes"] == first["wire_bytes"]
    out = capsys.readouterr().out
    assert "best accuracy" in out
    sent, radio = (sum(r["extra"][k] for r in result["rounds"]) / 3 / 1e6 for k in ("wire_bytes", "wire_radio_bytes"))
    assert f"fp32 models: {sent:.2f} MB sent per round ({radio:.2f} MB on the devices' links)" in out, out


@pytest.mark.slow
def test_federated_evaluation_every_n_rounds_and_after_the_last(tmp_path) -> None:
    """``--federated-eval-every 2`` scores the clients in rounds 2 and 4 and after the
    last (5); the other rounds record no accuracy, and the plot and summary use the rest.
    A config file sets the same key."""
    argv = ["simulate", "--strategy", "fedavg", "--dataset", "synthetic", "--data", "users=12", "--rounds", "5"]
    assert main([*argv, "--federated-eval-every", "2", "--out", str(tmp_path / "flag")]) == 0
    rounds = json.loads((tmp_path / "flag" / "fedavg_synthetic_seed0.json").read_text())["rounds"]
    scored = [r["round"] for r in rounds if r["federated_accuracy"] is not None]  # null: not scored
    assert scored == [2, 4, 5]
    assert (tmp_path / "flag" / "fedavg_synthetic_seed0.png").stat().st_size > 10_000
    config = tmp_path / "every.toml"
    config.write_text("[simulation]\nfederated_eval_every = 0\n")
    assert load_config(config).federated_eval_every == 0


def _not_json(constant: str) -> NoReturn:
    raise AssertionError(f"{constant} is Python's extension, not JSON")


def test_a_run_that_scores_no_round_says_so_and_compare_refuses_it(tmp_path, capsys, recwarn) -> None:
    argv = ["--strategy", "fedavg", "--dataset", "synthetic", "--data", "users=12", "--rounds", "2"]
    assert main(["simulate", *argv, "--federated-eval-every", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no accuracy measured (--federated-eval-every 0)" in out and "nan" not in out
    result = json.loads((tmp_path / "fedavg_synthetic_seed0.json").read_text(), parse_constant=_not_json)
    assert result["settings"]["federated_eval_every"]["value"] == 0
    assert [r["federated_accuracy"] for r in result["rounds"]] == [None, None]  # strict JSON: not measured is null
    assert (tmp_path / "fedavg_synthetic_seed0.png").stat().st_size > 10_000
    assert not [w for w in recwarn if "artists" in str(w.message)]  # no empty legend
    code = main(["compare", *argv[2:], "--strategies", "fedavg", "--federated-eval-every", "0", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "federated_eval_every must be 1 or more" in err and "Traceback" not in err


@pytest.mark.slow
def test_compare_command_writes_a_table(tmp_path) -> None:
    code = main(
        [
            "compare",
            "--strategies",
            "fedavg,fedgsp",
            "--seeds",
            "0,1",
            "--dataset",
            "synthetic",
            "--data",
            "users=12",
            "--rounds",
            "2",
            "--clients-per-round",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    table = (tmp_path / "comparison.md").read_text()
    assert "| fedavg |" in table and "| fedgsp |" in table and "±" in table
    assert (tmp_path / "comparison.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--strategy", "fedbest", "--rounds", "1"], "unknown strategy"),
        (["simulate", "--dataset", "femnist", "--data-dir", "/nowhere", "--rounds", "1"], "does not exist"),
        (
            ["simulate", "--strategy", "fedavg", "--clients-per-round", "500", "--data", "users=10", "--rounds", "1"],
            "only 10",
        ),
        (["simulate", "--dataset", "mnist", "--model", "mclr_femnist", "--rounds", "1", "--data", "clients=10"], None),
    ],
)
def test_bad_simulation_requests_get_clear_errors(tmp_path, capsys, argv, message) -> None:
    code = main([*argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    if message is None:  # a 62-class model on 10-class data works: labels fit
        assert code == 0
    else:
        assert code == 2
        assert message in err and "Traceback" not in err


def test_model_whose_classes_do_not_fit_the_data_is_refused(tmp_path, capsys) -> None:
    code = main(["simulate", "--dataset", "femnist", "--model", "mclr_mnist", "--rounds", "1", "--out", str(tmp_path)])
    assert code == 2
    assert "10 classes" in capsys.readouterr().err


def test_default_model_per_dataset() -> None:
    assert SimulationConfig(dataset="femnist").model_name == "cnn_femnist"


def test_strategies_command_lists_each_strategys_set_parameters(capsys) -> None:
    from server.strategies import strategy_parameters

    assert main(["strategies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    fedgsp = lines.index(next(line for line in lines if line.startswith("fedgsp ")))
    listed = {p.strip() for p in lines[fedgsp + 1].split("--set:")[1].split(",")}
    assert listed == strategy_parameters("fedgsp") - {"train"}
    assert "kappa" in listed


@pytest.mark.slow
def test_simulate_with_a_topology_stores_its_links_and_modelled_time(tmp_path, capsys) -> None:
    from tests.covey.test_cli_mistakes import assert_one_line_error, covey

    office = str(Path(__file__).resolve().parents[3] / "examples" / "topologies" / "office.toml")
    argv = ["simulate", "--strategy", "dsc", "--data", "users=12", "--rounds", "2", "--clients-per-round", "12"]
    argv += ["--out", str(tmp_path)]
    assert main([*argv, "--topology", office]) == 0
    result = json.loads((tmp_path / "dsc_synthetic_seed0.json").read_text())
    assert result["settings"]["topology"]["value"] == office
    assert result["links"]["counts"]["snr"] == {"topology": 144} and len(result["links"]["ids"]) == 12
    assert result["summary"]["modelled_s"] > 0 and all(r["t_round_s"] > 0 for r in result["rounds"])
    assert "modelled time on" in capsys.readouterr().out
    (tmp_path / "bad.toml").write_text("[[site]]\nname = 'a'\ndevices = 5\nbandwidth_mbps = 1\n")
    assert_one_line_error(covey(*argv, "--topology", str(tmp_path / "nope.toml")), "cannot read it")
    assert_one_line_error(
        covey(*argv, "--topology", str(tmp_path / "bad.toml")), "places 5 devices but the simulation has 12"
    )


@pytest.mark.slow
def test_the_worker_kind_comes_from_the_flag_and_is_recorded(tmp_path) -> None:
    """``--workers 2 --worker-kind process`` runs on forked processes and the results
    JSON says so; the flag's models are those of the default threads."""
    argv = ["simulate", "--strategy", "fedavg", "--dataset", "synthetic", "--data", "users=12", "--rounds", "2"]
    for kind in ("thread", "process"):
        assert main([*argv, "--workers", "2", "--worker-kind", kind, "--out", str(tmp_path / kind)]) == 0

    runs = {k: json.loads((tmp_path / k / "fedavg_synthetic_seed0.json").read_text()) for k in ("thread", "process")}
    assert runs["process"]["settings"]["worker_kind"]["value"] == "process"
    assert runs["process"]["settings"]["worker_kind"]["source"] == "flag"
    assert runs["thread"]["settings"]["workers"]["value"] == 2
    losses = {k: [r["train_loss"] for r in run["rounds"]] for k, run in runs.items()}
    assert losses["thread"] == losses["process"]


def test_by_default_a_simulation_has_a_worker_per_core_up_to_four(tmp_path: Path) -> None:
    assert main(["simulate", "--strategy", "fedavg", "--dataset", "synthetic", "--data", "users=12", "--rounds", "1",
                 "--out", str(tmp_path)]) == 0  # fmt: skip

    workers = json.loads((tmp_path / "fedavg_synthetic_seed0.json").read_text())["settings"]["workers"]
    cores = min(len(os.sched_getaffinity(0)), cpu_quota() or 1 << 30)
    assert workers == {"value": min(cores, 4), "source": "covey default", "detail": ""}


@pytest.mark.parametrize(
    ("text", "cores"),
    [("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None), ("bogus\n", None), (None, None)],
)
def test_a_container_s_cpu_quota_caps_the_default_workers(tmp_path: Path, text: str | None, cores: int | None) -> None:
    """``docker run --cpus 1.5`` writes "150000 100000" to cpu.max: two cores' worth of
    workers, however many cores the host has; no quota (or no file) leaves the affinity."""
    cpu_max = tmp_path / "cpu.max"
    if text is not None:
        cpu_max.write_text(text)

    assert cpu_quota(cpu_max) == cores
    affinity = len(os.sched_getaffinity(0))
    assert default_workers(cpu_max) == max(1, min(affinity, cores or affinity, 4))


@pytest.mark.parametrize("key", ["kappa", "alpha", "beta"])
def test_a_strategy_parameter_beyond_a_float_is_refused_by_name(tmp_path, key: str) -> None:
    """bench/fuzz.py found kappa = (a 400-digit integer) ending in OverflowError in a grouping check."""
    from device.errors import CoveyError
    from server.simulation.run import prepare

    path = tmp_path / "big.toml"
    path.write_text(f'[strategy]\nname = "fedgsp"\n{key} = {10**400}\n')
    with pytest.raises(CoveyError, match=f"strategy parameter {key} = an integer of 401 digits"):
        prepare(load_config(path))
