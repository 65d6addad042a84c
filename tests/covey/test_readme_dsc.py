"""The README's DSC commands run as typed (issue 29: "dsc needs 20 clients but the data
set has only 12" was the README's example's answer)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from covey.cli import main

REPO = Path(__file__).resolve().parents[2]


def readme_commands(prefix: str) -> list[list[str]]:
    """The README's commands that start with ``prefix``, continuation lines joined."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    return [shlex.split(line.split("#")[0]) for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.slow
def test_the_readmes_dsc_simulations_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands = readme_commands(".venv/bin/covey simulate --strategy dsc")
    assert len(commands) == 2
    monkeypatch.chdir(REPO)  # the README's paths are relative to the checkout
    for i, argv in enumerate(commands):
        out = tmp_path / str(i)
        assert main([*argv[1:], "--out", str(out)]) == 0, argv
        doc = json.loads(next(out.glob("*.json")).read_text())
        assert doc["settings"]["strategy.clients_per_round"]["value"] is None  # every client, Alg. 1
    assert doc["settings"]["channel"]["value"] == "awgn"
