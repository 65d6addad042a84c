"""Strategies by stable name: ``make_strategy("fedgsp", kappa=0.3)``.

The registry names each strategy's module and class and imports a strategy's module
only when that strategy is asked for: FedAvg never pays for scikit-learn, SciPy or
OR-Tools, which only the grouping strategies use.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from server.errors import StrategyError
from server.strategies.base import Strategy

# name -> (module, class); each class's ``name`` equals its key (tests/server/strategies)
REGISTRY: dict[str, tuple[str, str]] = {
    "fedavg": ("server.strategies.fedavg", "FedAvg"),
    "fedprox": ("server.strategies.fedavg", "FedProx"),
    "fedadagrad": ("server.strategies.fedavg", "FedAdagrad"),
    "fedadam": ("server.strategies.fedavg", "FedAdam"),
    "fedyogi": ("server.strategies.fedavg", "FedYogi"),
    "fedgsp": ("server.strategies.fedgsp", "FedGSP"),
    "naivegsp": ("server.strategies.fedgsp", "NaiveGSP"),
    "naivegsp_icg": ("server.strategies.fedgsp", "NaiveGSPICG"),
    "dsc": ("server.strategies.dsc", "DSC"),
    "fedgroup": ("server.strategies.fedgroup", "FedGroup"),
    "fedgrouprox": ("server.strategies.fedgroup", "FedGrouProx"),
    "flexcfl": ("server.strategies.fedgroup", "FlexCFL"),
    "ifca": ("server.strategies.ifca", "IFCA"),
    "fesem": ("server.strategies.fesem", "FeSEM"),
    "fedavg_ic": ("server.strategies.fedavg_ic", "FedAvgIC"),
    "hierfavg": ("server.strategies.fedavg_ic", "HierFAVG"),
}


def strategy_names() -> list[str]:
    return sorted(REGISTRY)


def strategy_class(name: str) -> type[Strategy]:
    """The class of strategy ``name``, importing its module on first use."""
    try:
        module, attr = REGISTRY[name]
    except KeyError:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(strategy_names())}") from None
    cls: type[Strategy] = getattr(importlib.import_module(module), attr)
    return cls


def strategy_parameters(name: str) -> set[str]:
    """The keyword parameters strategy ``name`` accepts."""
    cls = strategy_class(name)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    if cls.__module__ == "server.strategies.fedgroup":  # its variants pass their keywords on to FedGroup
        from server.strategies.fedgroup import FedGroup

        if issubclass(cls, FedGroup):
            accepted |= set(inspect.signature(FedGroup.__init__).parameters) - {"self"}
    return accepted


def make_strategy(name: str, **params: Any) -> Strategy:
    """Build a strategy by name; unknown names and parameters are clear errors."""
    accepted = strategy_parameters(name)
    cls = strategy_class(name)
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise StrategyError(f"strategy {name!r} has no parameter(s) {unknown}; it takes {sorted(accepted)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise StrategyError(f"bad parameters for strategy {name!r}: {exc}") from None
