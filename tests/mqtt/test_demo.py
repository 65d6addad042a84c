"""`covey demo` (the README's main command) end to end, on a smaller fleet."""

from __future__ import annotations

import json

import pytest

from covey.cli import main
from server.strategies.fedgsp import FedGSP

FEDGSP_PAPER = FedGSP.paper_settings

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_demo_runs_fedgsp_over_an_embedded_broker(tmp_path, capsys) -> None:
    code = main(["demo", "--rounds", "3", "--devices", "4", "--out", str(tmp_path)])

    out = capsys.readouterr().out
    assert code == 0
    assert "embedded MQTT broker (amqtt)" in out and "server-side test accuracy" in out
    result = json.loads((tmp_path / "results.json").read_text())
    rounds = result["rounds"]
    assert [m["round"] for m in rounds] == [1, 2, 3]
    assert all(m["trained"] == 4 and m["skipped"] == 0 for m in rounds)
    assert rounds[-1]["server_accuracy"] > rounds[0]["server_accuracy"]
    # FedGSP's own training reached the devices, and the file says where it came from
    assert result["settings"]["train.batch"] == {"value": 5, "source": "paper", "detail": FEDGSP_PAPER}
    assert (tmp_path / "results.png").stat().st_size > 10_000


def test_demo_with_an_unreachable_broker_says_so(tmp_path, capsys) -> None:
    code = main(["demo", "--rounds", "1", "--devices", "2", "--broker", "127.0.0.1:1", "--out", str(tmp_path)])
    assert code == 2
    assert "cannot reach the broker" in capsys.readouterr().err
