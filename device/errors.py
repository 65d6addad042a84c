"""covey's exception tree.

Every error a user can cause derives from :class:`CoveyError` and says what was
wrong and what to do. It lives in ``device/`` because every other part (server,
simulation, CLI) depends on ``device/`` and never the other way round.
"""

from __future__ import annotations


class CoveyError(Exception):
    """Base of every error covey raises on purpose."""


class ConfigError(CoveyError):
    """A configuration value, flag or file is missing or invalid."""


class ModelError(CoveyError):
    """A model file or its manifest is missing, malformed or does not match."""


class WeightsError(CoveyError):
    """A weight vector has the wrong length or dtype, or holds NaN/inf."""


class DataError(CoveyError):
    """A local data set is missing, malformed, or does not fit the model."""


class TransportError(CoveyError):
    """The broker or the network failed."""


class ProtocolError(CoveyError):
    """A message or frame does not follow the covey wire protocol."""
