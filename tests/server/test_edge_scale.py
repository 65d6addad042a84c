"""The scale run's parts at a small size (``bench/edge.py --scale`` runs 1,000 devices):
real agents in shared processes (server/lab/swarm.py) on their rooms' mosquittos,
bridged to the central one, with ``covey edge run --broker`` beside each; every round's
groups run at the edges and every device trains in each."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.lab.edge_scale import scale_run
from server.lab.swarm import main as swarm_main

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_devices_in_shared_processes_train_through_their_edges(tmp_path: Path) -> None:
    # Execute: 12 devices in 4 processes behind 2 edges, 2 rounds
    figures = scale_run(tmp_path, devices=12, edges=2, rounds=2, per_process=3)

    # Assert
    assert figures.trained_per_round == [12, 12]
    assert figures.groups_at_edges == 4  # one group per edge and round
    # /proc counts CPU in 10 ms ticks: an edge that hosts one small group a round can
    # spend less than a tick in two rounds (CI read 0.0 once), so only the reading is checked
    assert len(figures.edge_cpu_s_per_round) == 2 and all(c >= 0 for c in figures.edge_cpu_s_per_round)
    assert figures.coordinator_cpu_s_per_round > 0 and figures.coordinator_rss_mb > 0
    said = "".join(p.read_text() for p in tmp_path.glob("swarm-*.log"))
    assert said.count("agents ran, 3 of them trained (6 tasks)") == 4, said


def test_a_swarm_outside_its_federation_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--broker", "127.0.0.1:1", "--run", "r", "--first", "10", "--count", "5", "--total", "12"]
    code = swarm_main([*argv, "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "swarm: error: devices 10..14 are not in 0..11", err
