"""Strategies by stable name: ``make_strategy("fedgsp", kappa=0.3)``."""

from __future__ import annotations

import inspect
from typing import Any

from server.errors import StrategyError
from server.strategies.base import Strategy
from server.strategies.dsc import DSC
from server.strategies.fedavg import FedAdagrad, FedAdam, FedAvg, FedProx, FedYogi
from server.strategies.fedavg_ic import FedAvgIC, HierFAVG
from server.strategies.fedgroup import FedGroup, FedGrouProx, FlexCFL
from server.strategies.fedgsp import FedGSP, NaiveGSP, NaiveGSPICG
from server.strategies.fesem import FeSEM
from server.strategies.ifca import IFCA

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        FedAvg,
        FedProx,
        FedAdagrad,
        FedAdam,
        FedYogi,
        FedGSP,
        NaiveGSP,
        NaiveGSPICG,
        DSC,
        FedGroup,
        FedGrouProx,
        FlexCFL,
        IFCA,
        FeSEM,
        FedAvgIC,
        HierFAVG,
    )
}


def strategy_names() -> list[str]:
    return sorted(STRATEGIES)


def strategy_parameters(name: str) -> set[str]:
    """The keyword parameters strategy ``name`` accepts."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(strategy_names())}") from None
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    if issubclass(cls, FedGroup):
        accepted |= set(inspect.signature(FedGroup.__init__).parameters) - {"self"}
    return accepted


def make_strategy(name: str, **params: Any) -> Strategy:
    """Build a strategy by name; unknown names and parameters are clear errors."""
    accepted = strategy_parameters(name)
    cls = STRATEGIES[name]
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise StrategyError(f"strategy {name!r} has no parameter(s) {unknown}; it takes {sorted(accepted)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise StrategyError(f"bad parameters for strategy {name!r}: {exc}") from None
