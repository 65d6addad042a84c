"""A new user's mistakes with ``covey`` end in one line on stderr and exit status 2.

Every test runs the real command (a subprocess from the repository root, so the
checkout's code runs) and checks: exit status 2, exactly one line on stderr that
starts with the command's full name (``covey server run: error: ``), names the bad
value and what to do, no traceback anywhere, and no output written. A reader that
closes covey's stdout is not a mistake: covey stops quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from covey.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", **extra}


def covey(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "covey.cli", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
        timeout=timeout,
    )


def command_name(argv: Sequence[str]) -> str:
    """The name of the command ``covey ARGV`` runs: ``covey server run`` for ``server
    run --min-devices 0``, ``covey`` when no subcommand is recognised."""
    parser, name = build_parser(), "covey"
    for word in [a for a in argv if a not in ("-v", "--verbose")]:
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subcommands or word not in subcommands[0].choices:
            break
        parser = subcommands[0].choices[word]
        name = parser.prog
    return name


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit status 2, one stderr line ``covey COMMAND: error: ...`` holding every needle,
    no traceback."""
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert list(proc.args[1:3]) == ["-m", "covey.cli"], proc.args
    prefix = f"{command_name(proc.args[3:])}: error: "
    assert lines[0].startswith(prefix), (prefix, lines[0])
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- 1. a closed pipe ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "reader", "unbuffered"),
    [
        ("covey.cli strategies", "head -3", "1"),
        ("covey.cli strategies", "head -c 0", "1"),  # the reader is gone before the first write
        ("covey.cli strategies", "head -c 0", ""),  # block-buffered: the write happens at the final flush
        ("covey.cli --help", "head -c 0", ""),
        ("device.cli --help", "head -c 0", ""),
    ],
)
def test_a_closed_pipe_ends_quietly(tmp_path: Path, command: str, reader: str, unbuffered: str) -> None:
    err, status = tmp_path / "stderr", tmp_path / "status"
    env = _env()
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    shell = f'"{sys.executable}" -m {command} 2>"{err}" | {reader} >/dev/null; echo "${{PIPESTATUS[0]}}" >"{status}"'
    subprocess.run(shell, shell=True, executable="/bin/bash", cwd=REPO, env=env, timeout=120, check=True)
    assert err.read_text() == ""
    code = int(status.read_text())
    if reader == "head -c 0":
        assert code == 141  # 128 + SIGPIPE, what the shell reports for cat or grep in this spot
    else:
        assert code in (0, 141)  # 0 when head read everything before it left


# -- usage mistakes argparse finds ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["demo", "--rounds", "ten"], ["--rounds", "'ten'", "`covey demo --help`"]),
        (["demo", "--devices"], ["--devices", "expected one argument", "`covey demo --help`"]),
        (["bogus"], ["'bogus'", "strategies", "`covey --help`"]),
        (["model", "build", "nope"], ["unknown model 'nope'", "mlp_mnist"]),
        (["server", "run"], ["--min-devices", "`covey server run --help`"]),
        (["server", "run", "--min-devices", "2", "--broker", "127.0.0.1:9", "--edge", "a="], ["--edge 'a='", "NAME="]),
        (
            ["server", "run", "--min-devices", "2", "--broker", "127.0.0.1:9", "--edge", "a=x", "--edge", "b=x"],
            ["x is behind the edge a"],
        ),
        (["edge", "run", "--edge", "a", "--broker", "h:1"], ["--run is missing"]),
        (["device", "run", "--threads", "four"], ["--threads", "'four'", "`covey device run --help`"]),
    ],
)
def test_usage_mistakes_are_one_line(argv: list[str], needles: list[str]) -> None:
    assert_one_line_error(covey(*argv), *needles)


@pytest.mark.slow
def test_device_run_hands_every_flag_to_the_agent(tmp_path: Path) -> None:
    missing = tmp_path / "train.npz"
    proc = covey("device", "run", "--broker", "127.0.0.1:1", "--run", "r", "--data", str(missing))
    assert_one_line_error(proc, "--data", str(missing), "does not exist")  # "covey device run: error: ..."


# -- 2. and 3. demo settings ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--rounds", "0"], ["--rounds", "0", ">= 1"]),
        (["--rounds", "-3"], ["--rounds", "-3", ">= 1"]),
        (["--devices", "100"], ["--devices", "100", "1 to 51", "51 writers"]),
        (["--devices", "0"], ["--devices", "0", "1 to 51"]),
        (["--broker", "localhost"], ["--broker", "HOST:PORT", "'localhost'"]),
    ],
)
def test_demo_refuses_bad_settings_before_it_starts(tmp_path: Path, argv: list[str], needles: list[str]) -> None:
    out = tmp_path / "demo"
    proc = covey("demo", *argv, "--out", str(out), timeout=120)
    assert_one_line_error(proc, *needles)
    assert not out.exists()  # no broker, no agents, no output folder


@pytest.mark.slow
def test_demo_refuses_a_data_dir_without_enough_test_writers(tmp_path: Path) -> None:
    data = tmp_path / "leaf"
    (data / "train").mkdir(parents=True)
    (data / "test").mkdir()
    user = {"x": [[0.0] * 784], "y": [1]}
    for split, users in (("train", ["w1", "w2"]), ("test", ["w1"])):
        leaf = {"users": users, "num_samples": [1] * len(users), "user_data": {u: user for u in users}}
        (data / split / "a.json").write_text(json.dumps(leaf))
    out = tmp_path / "demo"
    proc = covey("demo", "--devices", "3", "--data-dir", str(data), "--out", str(out), timeout=120)
    assert_one_line_error(proc, "--devices", "1 to 2")
    proc = covey("demo", "--devices", "2", "--data-dir", str(data), "--out", str(out), timeout=120)
    assert_one_line_error(proc, "'w2'", "test")
    assert not out.exists()


# -- 4. compare --seeds ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("seeds", "needles"),
    [
        ("a,b", ["--seeds", "'a'", "comma-separated"]),
        ("1,x", ["--seeds", "'x'"]),
        ("1.5", ["--seeds", "'1.5'"]),
        (",", ["--seeds", "no seed"]),
        ("-1", ["--seeds", "'-1'", ">= 0"]),
        ("0,1,0", ["--seeds", "0", "twice"]),
    ],
)
def test_compare_refuses_bad_seeds_before_anything_runs(tmp_path: Path, seeds: str, needles: list[str]) -> None:
    out = tmp_path / "cmp"
    proc = covey("compare", "--strategies", "fedavg", "--rounds", "1", "--seeds", seeds, "--out", str(out))
    assert_one_line_error(proc, *needles)
    assert not out.exists()


def test_compare_seeds_parse() -> None:
    from covey.cli import parse_seeds

    assert parse_seeds("0") == [0]
    assert parse_seeds(" 3, 1 ,2,") == [3, 1, 2]
