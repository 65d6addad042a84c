"""``covey server run``, as a user types it, against a fleet of agent processes."""

from __future__ import annotations

import json

import pytest

from covey.cli import main
from device.protocol import TrainRequest, decode_message
from server.fleet import leaf_writers, start_fleet
from server.strategies.fedgsp import FedGSP
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_server_run_sends_fedgsps_own_training_and_writes_its_results(broker, observe, tmp_path, capsys) -> None:
    # Prepare
    run, root, state = "cli-run", femnist_root(), tmp_path / "state"
    observer = observe(run)

    # Execute: no --epochs, --batch or --lr: FedGSP's paper values must reach the boards
    with start_fleet(root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        code = main(
            [
                "server",
                "run",
                "--broker",
                broker.address,
                "--run",
                run,
                "--strategy",
                "fedgsp",
                "--min-devices",
                "4",
                "--rounds",
                "2",
                "--set",
                "beta=1",
                "--set",
                "kappa=1.0",
                "--set",
                "growth=linear",
                "--set",
                "alpha=0",
                "--eval-data",
                str(root),
                "--state-dir",
                str(state),
                "--register-timeout",
                "120",
            ]
        )

    # Assert
    assert code == 0
    requests = [m.body for m in observer.messages("/inbox") if isinstance(m.body, TrainRequest)]
    assert len(requests) == 8 and {(r.train.epochs, r.train.batch, r.train.lr) for r in requests} == {(1, 5, 0.01)}
    result = json.loads((state / "results.json").read_text())
    assert result["settings"]["train.batch"] == {"value": 5, "source": "paper", "detail": FedGSP.paper_settings}
    assert result["settings"]["strategy.beta"]["source"] == "flag"
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    assert all(0 < r["federated_accuracy"] <= 1 and 0 < r["server_accuracy"] <= 1 for r in result["rounds"])
    assert (state / "results.png").stat().st_size > 10_000
    links = result["links"]  # measured before round 1, stored with the results
    assert links["ids"] == [f"dev{i:03d}" for i in range(4)] and links["counts"]["rtt"]["measured"] == 12
    assert "results.json" in capsys.readouterr().out  # the closing summary says where the results went


def test_allow_devices_admits_only_the_listed_devices_and_the_screening_flags_reach_the_results(
    broker, observe, tmp_path
) -> None:
    # Prepare: four agents, three of them on the list; dev003 registers with valid topics but is not provisioned
    run, root, state = "cli-allow", femnist_root(), tmp_path / "state"
    allowed = tmp_path / "devices.txt"
    allowed.write_text("# the boards of this run\ndev000\ndev001\n\ndev002  # the third\n")
    observer = observe(run)

    # Execute
    with start_fleet(root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        code = main(
            [
                *("server", "run", "--broker", broker.address, "--run", run, "--strategy", "fedavg"),
                *("--set", "clients_per_round=3", "--min-devices", "3", "--rounds", "2"),
                *("--epochs", "1", "--batch", "10", "--lr", "0.01", "--state-dir", str(state)),
                *("--allow-devices", str(allowed), "--aggregation", "median", "--norm-factor", "5"),
                *("--register-timeout", "120"),
            ]
        )

    # Assert
    assert code == 0
    inboxes = [(t, decode_message(p)) for t, p in observer.seen if t.endswith("/inbox") and p]
    trained = {t.split("/")[-2] for t, m in inboxes if isinstance(m.body, TrainRequest)}
    assert trained == {"dev000", "dev001", "dev002"}
    result = json.loads((state / "results.json").read_text())
    settings = result["settings"]
    assert settings["allowed_devices"]["value"] == ["dev000", "dev001", "dev002"]
    assert (settings["aggregation"]["value"], settings["norm_factor"]["value"]) == ("median", 5.0)
    refused = sum(r["dropped"].get("registration refused: not on the allowlist", 0) for r in result["rounds"])
    assert refused >= 1


def test_a_simulation_config_file_runs_on_boards_with_its_sources_recorded(broker, observe, tmp_path, capsys) -> None:
    # Prepare: the file `covey simulate --config run.toml` reads (docs/running.md), with a data set
    run, root, state = "cli-config", femnist_root(), tmp_path / "state"
    config = tmp_path / "run.toml"
    config.write_text(
        '[simulation]\nrounds = 1\nseed = 4\nmodel = "mlp_femnist"\n\n[dataset]\nname = "femnist"\n\n'
        '[train]\nbatch = 7\nepochs = 1\n\n[strategy]\nname = "fedavg"\nclients_per_round = 4\n'
    )
    observer = observe(run)

    # Execute: the command of docs/running.md
    with start_fleet(root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        code = main(
            [
                *("server", "run", "--broker", broker.address, "--run", run, "--config", str(config)),
                *("--min-devices", "4", "--state-dir", str(state), "--register-timeout", "120"),
            ]
        )

    # Assert: the file's training reached every board, and the results say where each setting came from
    assert code == 0
    requests = [m.body for m in observer.messages("/inbox") if isinstance(m.body, TrainRequest)]
    assert len(requests) == 4 and {(r.train.epochs, r.train.batch) for r in requests} == {(1, 7)}
    settings = json.loads((state / "results.json").read_text())["settings"]
    assert settings["train.batch"] == {"value": 7, "source": "config file", "detail": str(config)}
    assert settings["strategy"]["value"] == "fedavg" and settings["seed"]["value"] == 4
    assert settings["strategy.clients_per_round"]["source"] == "config file"
    assert settings["train.lr"]["source"] == "covey default"  # FedAvg's paper is silent
    assert "left out (simulation only; each board trains on its own data): dataset" in capsys.readouterr().out
