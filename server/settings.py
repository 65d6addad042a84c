"""Effective settings and where each came from, for simulation and boards alike.

A method's paper fixes its local training (FedGSP: batch 5, one epoch; FlexCFL: ten
epochs of batch 10; ...). covey keeps those values unless the user sets one, and a
run's result file lists every effective setting with its :class:`Source`: the
method's paper, its authors' public code (where the paper is silent and the code
is not), covey's own default (where both are silent), a preset, a config file or a
command-line flag. Later sources win: default < authors' code < paper < preset <
config file < flag.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from server.errors import StrategyError

if TYPE_CHECKING:  # the strategies (and their scientific libraries) load only when resolving
    from server.strategies.base import Strategy, TrainConfig


class Source(str, Enum):
    DEFAULT = "covey default"
    CODE = "authors' code"  # a value the paper does not state, taken from its authors' public code
    PAPER = "paper"
    PRESET = "preset"
    CONFIG = "config file"
    FLAG = "flag"


@dataclass(frozen=True)
class Setting:
    """One effective value, its source and a detail (which paper, file or flag)."""

    value: Any
    source: Source
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source.value, "detail": self.detail}


TRAIN_KEYS = {"epochs": "epochs", "batch": "batch_size", "lr": "lr", "mu": "mu", "lr_decay": "lr_decay"}


def strategy_class(name: str) -> type[Strategy]:
    from server.strategies import strategy_class as lookup

    return lookup(name)


def resolve_training(name: str, given: Mapping[str, Setting]) -> tuple[TrainConfig, dict[str, Setting]]:
    """The local training of strategy ``name``: the user's values (``given``, keyed
    ``epochs``, ``batch``, ``lr``, ``mu``) over the paper's (``paper_train``).

    Returns the config and one :class:`Setting` per key (``train.<key>``).
    """
    from server.strategies.base import TrainConfig

    cls = strategy_class(name)
    paper = cls.paper_train
    declared = "paper_train" in _own_attributes(cls)
    out: dict[str, Setting] = {}
    values: dict[str, Any] = {}
    for key, attr in TRAIN_KEYS.items():
        if key in given:
            setting = given[key]
        elif (declared and key not in ("mu", "lr_decay")) or (key == "lr_decay" and paper.lr_decay != 1.0):
            # a paper that sets no schedule does not set "no decay": covey's default
            setting = Setting(getattr(paper, attr), Source.PAPER, cls.paper_settings)
        else:
            setting = Setting(getattr(paper, attr), Source.DEFAULT, "")
        values[attr] = setting.value
        out[f"train.{key}"] = setting
    unknown = set(given) - set(TRAIN_KEYS)
    if unknown:
        raise StrategyError(f"unknown training setting(s) {sorted(unknown)}; use {sorted(TRAIN_KEYS)}")
    try:
        config = TrainConfig(**values)
    except TypeError as exc:
        raise StrategyError(f"bad training settings: {exc}") from None
    return config, out


def _own_attributes(cls: type) -> set[str]:
    """Attributes set by ``cls`` or a base below :class:`Strategy`."""
    from server.strategies.base import Strategy

    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is Strategy:
            break
        names.update(vars(klass))
    return names


def _defaults(cls: type[Strategy]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():  # type: ignore[misc]
            if p.default is not inspect.Parameter.empty and p.name not in ("self", "train"):
                out[p.name] = p.default
    return out


def _check_fits_float(name: str, value: Any) -> None:
    """A number every strategy can compute with: a TOML or ``--set`` integer may have
    thousands of digits, and ``float()`` of one beyond 1.8e308 raises OverflowError deep
    in a grouping check (bench/fuzz.py found ``kappa = 10**60``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise StrategyError(f"{name} = an integer of {len(str(abs(value)))} digits is beyond any float") from None


def resolve_strategy_params(name: str, given: Mapping[str, Setting]) -> tuple[dict[str, Any], dict[str, Setting]]:
    """Constructor parameters of strategy ``name``: the user's over the class defaults.

        A default counts as the paper's when the class names it in ``paper_params``, and as
    the authors' public code's when it names it in ``code_params``.
        Returns the parameters to pass and one :class:`Setting` per parameter
        (``strategy.<name>``).
    """
    from server.strategies import strategy_parameters

    cls = strategy_class(name)
    accepted = strategy_parameters(name) - {"train"}
    unknown = sorted(set(given) - accepted)
    if unknown:
        raise StrategyError(f"strategy {name!r} has no parameter(s) {unknown}; it takes {sorted(accepted)}")
    for key, setting in given.items():
        _check_fits_float(f"strategy parameter {key}", setting.value)
    defaults = _defaults(cls)
    out: dict[str, Setting] = {}
    for key in sorted(accepted):
        if key in given:
            out[f"strategy.{key}"] = given[key]
        elif key in defaults:
            if key in cls.paper_params:
                out[f"strategy.{key}"] = Setting(defaults[key], Source.PAPER, cls.paper_settings)
            elif key in cls.code_params:
                out[f"strategy.{key}"] = Setting(defaults[key], Source.CODE, cls.code_settings)
            else:
                out[f"strategy.{key}"] = Setting(defaults[key], Source.DEFAULT, "")
    return {k: s.value for k, s in given.items()}, out
