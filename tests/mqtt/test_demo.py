"""`covey demo` (the README's main command) end to end, on a smaller fleet."""

from __future__ import annotations

import json

import pytest

from covey.cli import main

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_demo_runs_fedgsp_over_an_embedded_broker(tmp_path, capsys) -> None:
    code = main(["demo", "--rounds", "3", "--devices", "4", "--out", str(tmp_path)])

    out = capsys.readouterr().out
    assert code == 0
    assert "embedded MQTT broker (amqtt)" in out and "server-side test accuracy" in out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2, 3]
    assert all(m["trained"] == 4 and m["skipped"] == 0 for m in metrics)
    assert metrics[-1]["test_accuracy"] > metrics[0]["test_accuracy"]
    assert (tmp_path / "accuracy.png").stat().st_size > 10_000


def test_demo_with_an_unreachable_broker_says_so(tmp_path, capsys) -> None:
    code = main(["demo", "--rounds", "1", "--devices", "2", "--broker", "127.0.0.1:1", "--out", str(tmp_path)])
    assert code == 2
    assert "cannot reach the broker" in capsys.readouterr().err
