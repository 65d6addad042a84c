"""The conformance kit passes covey's own agent and names what a broken device gets wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from covey.cli import main
from server.conformance import RULES, run_conformance
from server.fleet import leaf_writers, start_fleet
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_covey_agent_conforms_to_every_rule(broker, tmp_path, capsys) -> None:
    # Prepare: one of covey's agents on the run the kit will play the server of
    root = femnist_root()
    with start_fleet(
        root,
        leaf_writers(root, 1),
        run="conf-ok",
        host=broker.host,
        port=broker.port,
        log_dir=tmp_path,
        device_ids=["board1"],
    ):
        # Execute: the command a user types
        code = main(
            ["conformance", "--broker", broker.address, "--run", "conf-ok", "--device", "board1", "--timeout", "30"]
        )

    # Assert
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{len(RULES)} of {len(RULES)} rules hold" in out
    assert "FAIL" not in out


def test_a_device_breaking_five_rules_gets_five_named_failures(broker, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare: the broken device, as a third party's process
    root = femnist_root()
    writer = leaf_writers(root, 1)[0]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    log = (tmp_path / "broken.log").open("wb")
    device = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "mqtt" / "broken_agent.py"),
            "--broker",
            broker.address,
            "--run",
            "conf-bad",
            "--id",
            "broken1",
            "--data",
            str(root / "train"),
            "--test",
            str(root / "test"),
            "--user",
            writer,
            "--state-dir",
            str(tmp_path / "state"),
            "--threads",
            "1",
            "--idle-timeout",
            "300",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # Execute
        report = run_conformance(
            broker.host, broker.port, "conf-bad", "broken1", ensure_model("mlp_femnist"), timeout=12
        )
    finally:
        device.terminate()
        device.wait(30)

    # Assert: exactly the six broken rules fail, each with what was seen
    failed = {v.rule: v.detail for v in report.failed}
    broken = {"frames_well_formed", "result_follows_frames", "pretrain_reply", "codecs", "platform", "held_result"}
    assert set(failed) == broken, report.table()
    assert "register carries no platform" in failed["platform"]
    assert "train results carries telemetry" in failed["platform"]
    assert "without ['fp16', 'int8', 'int8z']" in failed["codecs"]
    assert "group must be an integer" in failed["frames_well_formed"]
    assert "after the output frames" in failed["result_follows_frames"]
    assert "trained weights, not trained minus start" in failed["pretrain_reply"]
    assert "nothing delivered again after the new epoch" in failed["held_result"]


def test_a_device_that_lists_q8_but_cannot_train_from_it_fails_the_codecs_rule(broker, tmp_path) -> None:
    from covey.paths import ensure_model

    # Prepare: an agent whose codec list names q8 and whose decoder refuses it
    root = femnist_root()
    with start_fleet(
        root,
        leaf_writers(root, 1),
        run="conf-q8",
        host=broker.host,
        port=broker.port,
        log_dir=tmp_path,
        device_ids=["liar1"],
        scripts={"liar1": REPO / "tests" / "mqtt" / "q8_liar_agent.py"},
    ):
        # Execute
        report = run_conformance(broker.host, broker.port, "conf-q8", "liar1", ensure_model("mlp_femnist"), timeout=12)

    # Assert: only the codecs rule fails, for the q8 start model, and fp16 still passed
    failed = {v.rule: v.detail for v in report.failed}
    assert set(failed) == {"codecs"}, report.table()
    assert "with a q8 start model" in failed["codecs"], failed["codecs"]
    assert "fp16" not in failed["codecs"], failed["codecs"]
