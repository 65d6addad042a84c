"""Server-side errors (part of covey's one exception tree, rooted in device.errors)."""

from __future__ import annotations

from device.errors import CoveyError


class GroupingError(CoveyError, ValueError):
    """Input to a grouping or aggregation algorithm is invalid (empty, NaN, wrong shape...)."""


class StrategyError(CoveyError):
    """A strategy name or its settings are unknown or invalid."""
