"""A field with more than one room, through ``covey field-test`` as docs/site-guide.md
("More than one room") tells a user to rehearse it: two rooms of 3 boards on their own
networks, each behind a gateway whose uplink to the central broker is 4 Mbit/s and 50 ms
one way (``examples/topologies/two-rooms.toml``). The gateways run the rooms' mosquittos,
bridged to the central one, and ``covey edge run``; HierFAVG's groups are the rooms, and
each round's group runs at its room's edge, so only its model crosses the uplink.

With ``--central`` (the topology file's own comment says to add it) the gateways only
forward: the same links, every board's models crossing the uplinks, no group at an edge.

Everything runs in network namespaces the command creates and removes, also on failure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from covey.cli import main
from server.field.netns import leftovers
from tests.lab_marks import LAB_MARKS

REPO = Path(__file__).resolve().parents[2]
MODEL = 4 * 433_726  # the FEMNIST MLP, the default model, in float32
pytestmark = LAB_MARKS


def test_each_room_s_group_runs_at_its_edge_and_only_its_model_crosses_the_uplink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the command of docs/site-guide.md, with an output folder
    argv = ["field-test", str(REPO / "examples/topologies/two-rooms.toml"), "--strategy", "hierfavg"]
    argv += ["--rounds", "2", "--out", str(tmp_path / "field")]

    # Execute
    code = main(argv)

    # Assert: both rounds' groups are the rooms, run at the edges
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "the sites' edges ran 4 groups (logs/edge-*.log)" in out, out[-2000:]
    rows = json.loads((tmp_path / "field" / "state" / "results.json").read_text())["rounds"]
    rooms = [[f"{room}-0{k}" for k in range(1, 4)] for room in ("north", "south")]
    assert [sorted(map(sorted, r["groups"])) for r in rows] == [rooms, rooms]
    assert all(r["skipped"] == 0 and len(r["trained_ids"]) == 6 for r in rows), rows
    for room in ("north", "south"):
        said = (tmp_path / "field" / "logs" / f"edge-{room}.log").read_text()
        assert "round 2 group" in said and "3 trained, 0 skipped; its model sent up" in said, said[-1500:]
    # round 2 (round 1 also holds registration and the links' measurement): each board
    # got a start model from its edge and returned its own over its room's link, and the
    # uplinks carried the two rooms' group models and little else; through the central
    # broker alone, they would carry every board's two models
    traffic = json.loads((tmp_path / "field" / "field.json").read_text())["link_bytes"]
    boards = traffic["devices"]["down"][1] + traffic["devices"]["up"][1]
    uplinks = traffic["uplinks"]["down"][1] + traffic["uplinks"]["up"][1]
    assert boards > 12 * MODEL, traffic
    assert 2 * MODEL < uplinks < 3 * MODEL, traffic
    # the boards of a room reach each other through their edge: no uplink in their RTT
    report = json.loads((tmp_path / "field" / "field.json").read_text())
    assert all(s["measured_rtt_ms"] < 50 for s in report["sites"]), report["sites"]
    assert_no_namespaces_left(out)


def test_with_central_the_gateways_only_forward_and_every_model_crosses_the_uplinks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: the same command with --central
    argv = ["field-test", str(REPO / "examples/topologies/two-rooms.toml"), "--strategy", "hierfavg"]
    argv += ["--rounds", "2", "--central", "--out", str(tmp_path / "field")]

    # Execute
    code = main(argv)

    # Assert: the same groups (the coordinator is told the rooms either way), every one
    # run at the coordinator, and round 2's uplinks carried each board's start model and
    # its own model: the traffic the edges save
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "the sites' gateways only forwarded (--central): every group ran at the coordinator" in out, out[-2000:]
    rows = json.loads((tmp_path / "field" / "state" / "results.json").read_text())["rounds"]
    rooms = [[f"{room}-0{k}" for k in range(1, 4)] for room in ("north", "south")]
    assert [sorted(map(sorted, r["groups"])) for r in rows] == [rooms, rooms]
    assert all(r["skipped"] == 0 and len(r["trained_ids"]) == 6 for r in rows), rows
    assert not list((tmp_path / "field" / "logs").glob("edge-*.log"))
    traffic = json.loads((tmp_path / "field" / "field.json").read_text())["link_bytes"]
    assert traffic["uplinks"]["down"][1] + traffic["uplinks"]["up"][1] > 12 * MODEL, traffic
    assert_no_namespaces_left(out)


def assert_no_namespaces_left(out: str) -> None:
    prefix = re.search(r"network namespaces (\S+)\*", out)  # this test's (others may run beside it)
    assert prefix is not None, out[:2000]
    assert not [n for n in leftovers() if n.startswith(prefix.group(1))], leftovers()
