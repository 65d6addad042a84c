"""What a run learns and how: one typed model for ``covey simulate`` and ``covey server run``.

:class:`RunConfig` holds the settings that mean the same thing on virtual devices and
on boards: the strategy and its parameters, local training, rounds, seed, the model,
screening and aggregation, the wire codec and the federated evaluation schedule. The
simulator's :class:`~server.simulation.config.SimulationConfig` extends it with what
only a simulation has (data set, workers, distribution shift, topology); the server's
:class:`~server.serve.ServeOptions` holds one beside the coordinator's connection and
site settings. Both commands fill it the same way (a preset, then a config file, then
flags; ``origins`` remembers who set what) and resolve it with :func:`resolve_run`,
which builds the strategy once.

The agent has no copy: a board's own settings (broker, identity, data) are its
``device.toml``, and everything of the run it needs (training, codec, deadlines) comes
in each task from the server, so a board never reads the server's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeGuard

from device.errors import ConfigError, CoveyError
from device.protocol.codecs import WIRE_CODECS
from server.settings import Setting, Source, resolve_strategy_params, resolve_training

if TYPE_CHECKING:  # the strategies (and their scientific libraries) load only when resolving
    from server.screening import ScreeningConfig
    from server.strategies.base import Strategy, TrainConfig


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[float]:
    """An int or float that a float holds: TOML integers may have thousands of digits,
    and ``float()`` of one beyond 1.8e308 raises OverflowError (bench/fuzz.py found it)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def shown(value: Any) -> str:
    """A value as an error message quotes it: short, and never a 4,000-digit integer."""
    text = repr(value) if not (is_int(value) and value.bit_length() > 256) else "a huge integer"
    return text if len(text) <= 80 else text[:79] + "…"


@dataclass(frozen=True)
class RunConfig:
    """The learning settings of one run, checked on construction (one line on a mistake).

    ``None`` for ``epochs``, ``batch``, ``lr``, ``mu`` and ``lr_decay`` means the
    strategy's paper value; ``model`` ``None`` means the command's default model; ``clients_per_round``
    applies to the strategies that take it."""

    strategy: str = "fedavg"
    strategy_params: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    rounds: int = 50
    seed: int = 0
    epochs: int | None = None
    batch: int | None = None
    lr: float | None = None
    mu: float | None = None
    lr_decay: float | None = None  # the learning rate of round r is lr * lr_decay ** (r - 1)
    clients_per_round: int | None = None
    screening: bool = True  # the update-norm bound (server/screening.py)
    norm_factor: float = 10.0
    aggregation: str = "mean"
    trim: float = 0.2
    codec: str = "fp32"  # how models travel (device/protocol/codecs.py): fp32, fp16, int8, int4
    # every N rounds (and after the last) each client scores the model it would use on its
    # own test set; 0: never
    federated_eval_every: int = 1
    # who set what: "rounds", "epochs", "strategy.<key>", ... -> (source, detail)
    origins: Mapping[str, tuple[Source, str]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, str):
            raise ConfigError(f"strategy must be a string, got {shown(self.strategy)}")
        if self.model is not None and not (isinstance(self.model, str) and self.model):
            raise ConfigError(f"model must be the name of a zoo model (a string), got {shown(self.model)}")
        if self.codec not in WIRE_CODECS:
            raise ConfigError(f"codec must be one of {', '.join(WIRE_CODECS)}, got {shown(self.codec)}")
        for name, value, low in (
            ("rounds", self.rounds, 1),
            ("epochs", self.epochs, 1),
            ("batch", self.batch, 1),
            ("seed", self.seed, 0),
            ("clients_per_round", self.clients_per_round, 1),
            ("federated_eval_every", self.federated_eval_every, 0),
        ):
            if value is None and name in ("epochs", "batch", "clients_per_round"):
                continue
            if not is_int(value) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {shown(value)}")
        if self.lr is not None and not (is_number(self.lr) and 0 < self.lr < float("inf")):
            raise ConfigError(f"lr must be a positive number, got {shown(self.lr)}")
        if self.mu is not None and not (is_number(self.mu) and 0 <= self.mu < float("inf")):
            raise ConfigError(f"mu must be a number >= 0, got {shown(self.mu)}")
        if self.lr_decay is not None and not (is_number(self.lr_decay) and 0 < self.lr_decay <= 1):
            raise ConfigError(f"lr_decay must be a number in (0, 1] (1: no decay), got {shown(self.lr_decay)}")
        if not isinstance(self.screening, bool):
            raise ConfigError(f"screening must be true or false, got {shown(self.screening)}")
        if not is_number(self.norm_factor) or not is_number(self.trim) or not isinstance(self.aggregation, str):
            raise ConfigError(
                "norm_factor and trim must be numbers and aggregation a string, got "
                f"{shown(self.norm_factor)}, {shown(self.trim)}, {shown(self.aggregation)}"
            )
        try:
            self.screening_config()
        except CoveyError as exc:
            raise ConfigError(f"{exc} (screening: norm_factor, aggregation, trim)") from None

    def screening_config(self) -> ScreeningConfig:
        """What the round driver screens and how it averages (:mod:`server.screening`)."""
        from server.screening import ScreeningConfig

        return ScreeningConfig(
            norm_factor=float(self.norm_factor) if self.screening else None,
            aggregation=self.aggregation,  # type: ignore[arg-type]
            trim=float(self.trim),
        )

    def with_overrides(self, source: Source = Source.FLAG, detail: str = "", **changes: Any) -> Any:
        """A copy (of the same class) with ``changes`` set by ``source``; ``None`` values
        are ignored, and ``strategy_params`` and ``dataset_params`` merge key by key."""
        changes = {k: v for k, v in changes.items() if v is not None}
        origins = dict(self.origins)
        for key, value in changes.items():
            if key in ("strategy_params", "dataset_params"):
                prefix = key.split("_")[0]
                origins.update({f"{prefix}.{k}": (source, detail) for k in value})
            else:
                origins[key] = (source, detail)
        for key in ("strategy_params", "dataset_params"):
            if key in changes:
                changes[key] = {**getattr(self, key), **changes[key]}
        return replace(self, origins=origins, **changes)

    def setting(self, key: str, value: Any) -> Setting:
        """The effective setting ``key`` (``value``) with where it came from."""
        source, detail = self.origins.get(key, (Source.DEFAULT, ""))
        return Setting(value, source, detail)

    def given(self, prefix: str) -> dict[str, Setting]:
        """The settings under ``prefix`` that someone set (``train``, ``strategy``, ``dataset``)."""
        if prefix == "train":
            values = {"epochs": self.epochs, "batch": self.batch, "lr": self.lr, "mu": self.mu}
            values["lr_decay"] = self.lr_decay
            return {k: self.setting(k, v) for k, v in values.items() if v is not None}
        params = self.strategy_params if prefix == "strategy" else getattr(self, "dataset_params", {})
        return {k: self.setting(f"{prefix}.{k}", v) for k, v in params.items()}

    def learning(self) -> RunConfig:
        """Only the settings of this class (what a server run takes from a simulation's
        file or preset), with their origins."""
        names = RunConfig.__dataclass_fields__
        return RunConfig(**{name: getattr(self, name) for name in names})

    def learning_settings(self) -> dict[str, Setting]:
        """The recorded form of the settings every run shares (results files)."""
        keys = ("strategy", "rounds", "seed", "screening", "norm_factor", "aggregation", "trim", "codec")
        return {key: self.setting(key, getattr(self, key)) for key in (*keys, "federated_eval_every")}


_RANK = {source: rank for rank, source in enumerate(Source)}  # later sources win (server/settings.py)


@dataclass(frozen=True)
class ResolvedRun:
    """A run's strategy with every setting resolved: its training (paper values unless
    set), its parameters, the recorded settings of both, and the strategy built once
    from them (the run's own, keeping its state)."""

    train: TrainConfig
    params: dict[str, Any]
    settings: dict[str, Setting]
    strategy: Strategy


def resolve_run(cfg: RunConfig) -> ResolvedRun:
    """Resolve and check ``cfg``'s strategy: the user's training and parameters over
    the paper's, ``clients_per_round`` where the strategy takes it, and the strategy
    built once (a bad value raises :class:`~server.errors.StrategyError` here, before
    anything runs)."""
    from server.strategies import make_strategy, strategy_parameters

    train, train_settings = resolve_training(cfg.strategy, cfg.given("train"))
    given = cfg.given("strategy")
    if cfg.clients_per_round is not None and "clients_per_round" in strategy_parameters(cfg.strategy):
        # set twice (a file's [strategy] table and --clients-per-round): the later source wins
        top = cfg.setting("clients_per_round", cfg.clients_per_round)
        inner = given.get("clients_per_round")
        if inner is None or _RANK[top.source] >= _RANK[inner.source]:
            given["clients_per_round"] = top
    params, param_settings = resolve_strategy_params(cfg.strategy, given)
    strategy = make_strategy(cfg.strategy, train=train, **params)
    return ResolvedRun(train, params, {**train_settings, **param_settings}, strategy)
