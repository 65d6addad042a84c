"""covey-device refuses bad settings with one line and exit status 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from device.cli import main


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.npz"
    np.savez(path, x=np.zeros((4, 60), np.float32), y=np.array([0, 1, 2, 3]))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_unknown_config_key_is_named(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'data = "{data}"\nbrokr = "localhost:1883"\n')
    code, err = _run(capsys, "--config", str(config))
    assert code == 2 and "unknown key(s) ['brokr']" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--broker", "localhost", "--run", "r"], "--broker must be HOST:PORT"),
        (["--broker", "localhost:1883"], "--run is required"),
        (["--broker", "localhost:1883", "--run", "r", "--data", "/nonexistent/train.npz"], "does not exist"),
    ],
)
def test_bad_flags_say_what_is_wrong(
    data: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    if "--data" not in argv:
        argv = [*argv, "--data", str(data)]
    code, err = _run(capsys, *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_bad_training_priority_in_the_config_file(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'data = "{data}"\nbroker = "127.0.0.1:1"\nrun = "r"\ntrain_priority = "realtime"\n')
    code, err = _run(capsys, "--config", str(config), "--state-dir", str(tmp_path / "state"))
    assert code == 2 and "training priority must be one of" in err


def test_help_lists_the_training_priority(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--train-priority {idle,normal}" in capsys.readouterr().out


def test_the_training_priority_falls_back_to_the_environment_below_the_config_and_the_flag(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from device.cli import PRIORITY_ENV, _settings, build_parser

    base = ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(data)]
    monkeypatch.setenv(PRIORITY_ENV, "normal")
    assert _settings(build_parser().parse_args(base)).get("train_priority") == "normal"
    flag = build_parser().parse_args([*base, "--train-priority", "idle"])
    assert _settings(flag).get("train_priority") == "idle"
    config = tmp_path / "agent.toml"
    config.write_text('train_priority = "idle"\n')
    assert _settings(build_parser().parse_args([*base, "--config", str(config)])).get("train_priority") == "idle"
    monkeypatch.setenv(PRIORITY_ENV, "realtime")  # a bad value names where it came from
    code, err = _run(capsys, *base, "--state-dir", str(tmp_path / "state"))
    assert code == 2 and PRIORITY_ENV in err and "training priority must be one of" in err
