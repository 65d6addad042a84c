"""The strategy registry: names match classes, and a run imports only what it uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from server.errors import StrategyError
from server.strategies import strategy_class, strategy_names

HEAVY = ("sklearn", "ortools", "matplotlib", "scipy")


@pytest.mark.parametrize("name", strategy_names())
def test_every_registry_entry_names_a_class_of_that_name(name: str) -> None:
    assert strategy_class(name).name == name


def test_an_unknown_strategy_is_a_clear_error_listing_the_known_ones() -> None:
    with pytest.raises(StrategyError, match=r"unknown strategy 'nope'; choose one of .*fedavg"):
        strategy_class("nope")


def test_importing_the_cli_and_building_fedavg_imports_no_heavy_library() -> None:
    code = f"""
import json, sys
import covey.cli
from server.simulation.config import SimulationConfig
from server.simulation.run import prepare
from server.simulation.engine import Simulation
prepare(SimulationConfig(strategy="fedavg", dataset="femnist", clients_per_round=10)).strategy
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({list(HEAVY)!r}))))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ), check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
