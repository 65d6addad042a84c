"""Mistakes in starting a run are caught before anything starts or any file is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.covey.test_cli_mistakes import assert_one_line_error, covey


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--rounds", "-1", "--min-devices", "1"], ["rounds must be an integer >= 1, got -1"]),
        (["--rounds", "0", "--min-devices", "1"], ["rounds must be an integer >= 1"]),
        (["--strategy", "fedavg", "--min-devices", "2"], ["fedavg needs 10 devices", "--min-devices is 2"]),
        (["--strategy", "nope", "--min-devices", "2"], ["unknown strategy 'nope'"]),
        (["--set", "kappa=2", "--min-devices", "2"], ["kappa (κ, the group sampling rate) must be in (0, 1], got 2.0"]),
        (["--min-devices", "0"], ["--min-devices must be at least 1"]),
    ],
)
def test_server_run_refuses_bad_settings_before_it_starts(tmp_path: Path, argv: list[str], needles: list[str]) -> None:
    state = tmp_path / "state"
    proc = covey("server", "run", "--broker", "127.0.0.1:1", "--state-dir", str(state), *argv)
    assert_one_line_error(proc, *needles)
    assert not state.exists()  # nothing was started, nothing written


def test_compare_with_no_strategies_overwrites_nothing(tmp_path: Path) -> None:
    # Prepare: the results of an earlier comparison
    (tmp_path / "comparison.md").write_text("earlier results\n")

    # Execute
    proc = covey("compare", "--strategies", "", "--rounds", "1", "--out", str(tmp_path))

    # Assert
    assert_one_line_error(proc, "--strategies needs at least one strategy name")
    assert (tmp_path / "comparison.md").read_text() == "earlier results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comparison.md"]


@pytest.mark.slow
def test_compare_rejects_an_unknown_strategy_before_running_the_others(tmp_path: Path) -> None:
    proc = covey("compare", "--strategies", "fedavg,nope", "--rounds", "1", "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, "unknown strategy 'nope'")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["simulate", "--preset", "nope"], ["unknown preset 'nope'", "covey presets"]),
        (
            ["compare", "--strategies", "fedavg,fedgsp", "--set", "kappa=0.5"],
            ["'fedavg' has no parameter(s) ['kappa']"],
        ),
        (["simulate", "--strategy", "fedgsp", "--batch", "0"], ["batch must be an integer >= 1"]),
        (["simulate", "--strategy", "fedprox", "--mu", "-1"], ["mu must be a number >= 0"]),
    ],
)
def test_simulation_settings_are_checked_first(tmp_path: Path, argv: list[str], needles: list[str]) -> None:
    proc = covey(*argv, "--rounds", "1", "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, *needles)
    assert not (tmp_path / "out").exists()
