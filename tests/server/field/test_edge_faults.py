"""What a field test's edge faults read from the run's logs (server/field/edge_faults.py);
the faults themselves run in namespaces in ``bench/edge.py --faults``."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any, cast

from server.field.edge_faults import EdgeProcess, FieldScene, lost_contributions, wait_for_round_at_edge


def test_a_contribution_is_lost_when_a_board_trained_and_the_round_does_not_hold_it(tmp_path: Path) -> None:
    # Prepare: two boards trained rounds 1 and 2; the records hold both in round 1, one in round 2
    (tmp_path / "a-01.log").write_text(
        "a-01: round 1 group 0 position 0 trained 5\na-01: round 2 group 0 position 0 trained 5\n"
    )
    (tmp_path / "a-02.log").write_text(
        "a-02: round 1 group 0 position 1 trained 5\na-02: round 2 group 0 position 1 trained 5\n"
    )
    (tmp_path / "edge-a.log").write_text("a-03: round 2 group 0 position 0 trained 5\n")  # an edge's log is no board's
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps({"rounds": [{"round": 1, "trained_ids": ["a-01", "a-02"]}, {"round": 2, "trained_ids": ["a-01"]}]})
    )

    # Execute, assert
    assert lost_contributions(tmp_path, results) == 1


def test_the_fault_waits_until_every_member_holds_its_start_model(tmp_path: Path) -> None:
    # Prepare: an edge running round 2's group 1 of a-01 and a-02; only a-01 has its model
    edge_log = tmp_path / "edge-a.log"
    edge_log.write_text("round 2 group 1: 2 members, run here\n")
    (tmp_path / "a-01.log").write_text("a-01: model for e1-r2-g1-p0 arrived from server\n")
    proc = cast("subprocess.Popen[bytes]", None)
    scene = FieldScene(cast(Any, None), tmp_path, members={"a": ("a-01", "a-02")})
    scene.edges["a"] = EdgeProcess([], edge_log, {}, tmp_path, proc)

    # Execute, assert: not yet (a short timeout); the group started; then a-02's model comes
    assert not wait_for_round_at_edge(scene, "a", 2, training=True, timeout=0.3)
    assert wait_for_round_at_edge(scene, "a", 2, training=False, timeout=0.3)
    later = threading.Timer(
        0.2, lambda: (tmp_path / "a-02.log").write_text("a-02: model for e1-r2-g1-p1 arrived from server\n")
    )
    later.start()
    assert wait_for_round_at_edge(scene, "a", 2, training=True, timeout=10)
    later.join()
    # a run that ended stops the wait at once
    scene.done.set()
    assert not wait_for_round_at_edge(scene, "a", 3, training=False, timeout=10)
