"""Does each preset list every way its runs depart from the paper? (``covey presets --check``)

For every method a preset runs (its own and those it reports a paper figure for), the
run's settings are resolved as ``covey simulate --preset NAME --strategy S`` would
resolve them (:func:`server.run_config.resolve_run`). A setting whose value comes from
covey's defaults or from the authors' public code rather than the paper, or from a
behaviour that is not a setting (how group models start), is a departure: a
:class:`~server.simulation.presets.Departure` of the preset must name it. Settings
that do not change the method are exempt (:data:`NEUTRAL`): the seed, the evaluation
schedule, values that mean "none of covey's additions" (fp32 models, the plain
mean, no proximal term, no learning-rate decay, uniform client sampling), and
screening's bound when screening is off (as every preset runs it: the papers screen
nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.settings import Setting, Source
from server.simulation.presets import PRESETS, Preset

# settings that never change what a method computes, whatever their source
EXEMPT = frozenset({"seed", "federated_eval_every", "trim"})
# values that are the papers' own absence of a covey feature
NEUTRAL: Mapping[str, Any] = {
    "codec": "fp32",
    "aggregation": "mean",
    "train.mu": 0.0,
    "train.lr_decay": 1.0,
    "strategy.warmup": "none",
}
DEPARTING_SOURCES = (Source.DEFAULT, Source.CODE)


@dataclass(frozen=True)
class Unlisted:
    """A departure no entry of the preset's ``departures`` names."""

    preset: str
    strategy: str
    key: str
    value: Any
    source: str

    def __str__(self) -> str:
        return f"{self.preset}: {self.strategy}: {self.key} = {self.value!r} ({self.source}) is not listed"


def run_settings(preset: Preset, strategy: str) -> dict[str, Setting]:
    """Every recorded setting of ``strategy`` run in ``preset``, plus ``starts`` for
    strategies whose group models start apart (:class:`~server.strategies.clustered.
    GroupModelStrategy`'s ``distinct_starts``)."""
    from server.run_config import resolve_run
    from server.simulation.config import SimulationConfig

    cfg = preset.apply(SimulationConfig(), strategy)
    resolved = resolve_run(cfg)
    settings = {**cfg.learning_settings(), **resolved.settings}
    if getattr(resolved.strategy, "distinct_starts", False):
        settings["starts"] = Setting("perturbed copies", Source.DEFAULT)
    return settings


def covered(preset: Preset, strategy: str, key: str) -> bool:
    names = {key, f"{strategy}:{key}"}
    return any(names & set(d.covers) for d in preset.departures)


def unlisted_departures(preset: Preset) -> list[Unlisted]:
    """The settings of ``preset``'s runs that depart from the paper without a listed
    departure (module docstring); empty when the preset lists them all."""
    out: list[Unlisted] = []
    for strategy in dict.fromkeys([preset.strategy, *preset.reported]):
        settings = run_settings(preset, strategy)
        inert = {"norm_factor"} if settings["screening"].value is False else set()  # the bound of screening
        for key, setting in sorted(settings.items()):
            if key in EXEMPT | inert or setting.source not in DEPARTING_SOURCES:
                continue
            if key in NEUTRAL and setting.value == NEUTRAL[key]:
                continue
            if not covered(preset, strategy, key):
                out.append(Unlisted(preset.name, strategy, key, setting.value, setting.source.value))
    return out


def check_presets() -> list[Unlisted]:
    """:func:`unlisted_departures` of every preset."""
    return [u for p in PRESETS.values() for u in unlisted_departures(p)]
