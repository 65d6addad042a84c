"""Simulation settings from a TOML file and command-line flags.

A file looks like::

    [simulation]
    rounds = 300
    seed = 0
    workers = 2              # default: one per core, at most 4
    worker_kind = "thread"   # thread | process: where the workers run
    topology = "examples/topologies/office.toml"   # links (server/simulation/topology.py)
    federated_eval_every = 1  # score every client every N rounds (and after the last; 0: never)

    [dataset]
    name = "synthetic"      # synthetic | femnist | mnist
    alpha = 1.0
    beta = 1.0
    users = 100

    [train]                 # leave out what the method's paper sets
    epochs = 10
    batch = 10
    lr = 0.01
    mu = 0.0
    lr_decay = 1.0          # the learning rate of round r is lr * lr_decay ** (r - 1)

    [strategy]
    name = "flexcfl"
    n_groups = 5
    clients_per_round = 20

    [screening]             # what the round driver refuses and how it averages
    enabled = true          # the update-norm bound (server/screening.py)
    norm_factor = 10.0      # refuse updates above 10x the round's median norm
    aggregation = "mean"    # mean | median | trimmed_mean (Yin et al. 2018)
    trim = 0.2              # the trimmed mean's fraction cut at each end

Flags override the file, the file overrides a preset (``--preset``), and a preset
overrides the method's paper settings; ``origins`` remembers which source set each
key (:mod:`server.settings`). Training settings left unset take the strategy's own
paper values. Unknown keys are errors that name the key.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from device.errors import ConfigError
from server.run_config import RunConfig, is_int, is_number, shown
from server.settings import Source
from server.simulation.channel import CHANNELS
from server.simulation.threads import WORKER_KINDS, WorkerKind, default_workers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATASETS = ("synthetic", "femnist", "mnist")
DEFAULT_MODEL = {"synthetic": "mclr_synthetic", "femnist": "cnn_femnist", "mnist": "mclr_mnist"}
DATASET_KEYS = {
    "synthetic": {"alpha", "beta", "users", "iid"},
    "femnist": {"data_dir"},
    "mnist": {"clients", "scheme", "classes_per_client", "dirichlet_alpha", "source", "imbalance"},
}
# each data-set setting's kind: "number" (>= 0), "count" (integer >= 1), "flag" (bool) or a string
DATASET_KINDS = {
    "alpha": "number",
    "beta": "number",
    "users": "count",
    "iid": "flag",
    "data_dir": "string",
    "clients": "count",
    "scheme": "string",
    "classes_per_client": "count",
    "dirichlet_alpha": "number",
    "source": "string",
    "imbalance": "flag",
}
SHIFT_MODES = ("all", "part")


def _check_dataset_value(key: str, value: Any) -> None:
    kind = DATASET_KINDS[key]
    ok = {
        "number": lambda v: is_number(v) and v >= 0 and v == v and v != float("inf"),
        "count": lambda v: is_int(v) and v >= 1,
        "flag": lambda v: isinstance(v, bool),
        "string": lambda v: isinstance(v, str) and bool(v),
    }[kind](value)
    if not ok:
        rule = {
            "number": "a finite number >= 0",
            "count": "an integer >= 1",
            "flag": "true or false",
            "string": "a non-empty string",
        }
        raise ConfigError(f"dataset setting {key} must be {rule[kind]}, got {shown(value)}")


@dataclass(frozen=True)
class SimulationConfig(RunConfig):
    """A run's learning settings (:class:`~server.run_config.RunConfig`, shared with
    ``covey server run``) and what only a simulation has: the data set, the workers,
    distribution shift and a link topology."""

    dataset: str = "synthetic"
    dataset_params: dict[str, Any] = field(default_factory=dict)
    workers: int = field(default_factory=default_workers)  # one per core, at most 4 (threads.py)
    worker_kind: WorkerKind = "thread"  # with workers > 1: threads of this process or forked processes
    shift_probability: float = 0.0
    shift_mode: str = "all"
    topology: str | None = None  # a topology TOML (server/simulation/topology.py); None: no links
    link_grouping: bool = True  # strategies get the topology's matrices (False: they time the rounds only)
    channel: str = "none"  # "awgn": the topology's Γ corrupts updates on their way (server/simulation/channel.py)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("dataset", "shift_mode"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a string, got {shown(getattr(self, name))}")
        if self.dataset not in DATASETS:
            raise ConfigError(f"unknown data set {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        if not isinstance(self.link_grouping, bool):
            raise ConfigError(f"link_grouping must be true or false, got {shown(self.link_grouping)}")
        if not self.link_grouping and self.topology is None:
            raise ConfigError("link_grouping = false (--no-link-grouping) needs a topology (--topology FILE) to time")
        if self.channel not in CHANNELS:
            raise ConfigError(f"channel must be one of {', '.join(CHANNELS)}, got {shown(self.channel)}")
        if self.channel != "none" and self.topology is None:
            raise ConfigError(f"channel = {self.channel} (--channel) needs a topology (--topology FILE) for its SNRs")
        if self.worker_kind not in WORKER_KINDS:
            raise ConfigError(f"worker_kind must be one of {', '.join(WORKER_KINDS)}, got {shown(self.worker_kind)}")
        if self.shift_mode not in SHIFT_MODES:
            raise ConfigError(f"shift_mode must be one of {', '.join(SHIFT_MODES)}, got {self.shift_mode!r}")
        unknown = set(self.dataset_params) - DATASET_KEYS[self.dataset]
        if unknown:
            raise ConfigError(
                f"data set {self.dataset!r} has no setting(s) {sorted(unknown)}; "
                f"it takes {sorted(DATASET_KEYS[self.dataset])}"
            )
        for key, value in self.dataset_params.items():
            _check_dataset_value(key, value)
        if not is_int(self.workers) or self.workers < 1:
            raise ConfigError(f"workers must be an integer >= 1, got {shown(self.workers)}")
        if not (is_number(self.shift_probability) and 0 <= self.shift_probability <= 1):
            raise ConfigError(f"shift probability must be in [0, 1], got {shown(self.shift_probability)}")

    @property
    def model_name(self) -> str:
        return self.model or DEFAULT_MODEL[self.dataset]

    def only_simulated(self) -> list[str]:
        """The settings someone set that only a simulation uses (a server run taking
        this file or preset says it leaves them out)."""
        own = set(SimulationConfig.__dataclass_fields__) - set(RunConfig.__dataclass_fields__)
        return sorted(key for key in self.origins if key.split(".")[0] in own or key.startswith("dataset."))


SECTIONS = {"simulation", "dataset", "train", "strategy", "screening"}
SCREENING_KEYS = {"enabled": "screening", "norm_factor": "norm_factor", "aggregation": "aggregation", "trim": "trim"}


def load_config(path: Path | str, base: SimulationConfig | None = None) -> SimulationConfig:
    """Read a TOML settings file (see the module docstring) over ``base``."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text; give a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path} ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, a > 4300-digit integer, deep nesting
        raise ConfigError(f"config file {path} is not valid TOML: {str(exc)[:200] or type(exc).__name__}") from None
    unknown = set(raw) - SECTIONS
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {sorted(unknown)}; use {sorted(SECTIONS)}")
    for section in SECTIONS & set(raw):
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{path}: [{section}] must be a table of settings, got {shown(raw[section])}")
    sim, data, train, strat, screen = (
        dict(raw.get(s, {})) for s in ("simulation", "dataset", "train", "strategy", "screening")
    )
    kwargs: dict[str, Any] = {}
    if isinstance(sim.get("topology"), str) and not Path(sim["topology"]).is_absolute():
        sim["topology"] = str(path.parent / sim["topology"])  # relative to the config file
    for key in (
        "rounds",
        "seed",
        "workers",
        "worker_kind",
        "model",
        "shift_probability",
        "shift_mode",
        "clients_per_round",
        "topology",
        "link_grouping",
        "channel",
        "codec",
        "federated_eval_every",
    ):
        if key in sim:
            kwargs[key] = sim.pop(key)
    if sim:
        raise ConfigError(f"{path}: unknown [simulation] key(s) {sorted(sim)}")
    for key in ("epochs", "batch", "lr", "mu", "lr_decay"):
        if key in train:
            kwargs[key] = train.pop(key)
    if train:
        raise ConfigError(f"{path}: unknown [train] key(s) {sorted(train)}")
    for key, field_name in SCREENING_KEYS.items():
        if key in screen:
            kwargs[field_name] = screen.pop(key)
    if screen:
        raise ConfigError(f"{path}: unknown [screening] key(s) {sorted(screen)}; use {sorted(SCREENING_KEYS)}")
    if "name" in data:
        kwargs["dataset"] = data.pop("name")
    kwargs["dataset_params"] = data
    if "name" in strat:
        kwargs["strategy"] = strat.pop("name")
    kwargs["strategy_params"] = strat
    base = base or SimulationConfig()
    if kwargs.get("dataset", base.dataset) != base.dataset:
        base = replace(base, dataset_params={})  # a preset's data settings belong to its data set
    try:
        return base.with_overrides(Source.CONFIG, str(path), **kwargs)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_assignments(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` flags with values read as TOML scalars (ints, floats, booleans,
    quoted or bare strings)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"expected key=value, got {item!r}")
        key, text = item.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = text.strip()
    return out
