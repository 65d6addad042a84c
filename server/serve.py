"""Run a coordinator from the command line (``covey server run``) and the demo.

Shows a progress bar and one log line per round, writes ``metrics.json`` and
``metrics.csv`` every round and ``accuracy.png`` at the end, advertises the run with
zeroconf (``--advertise``), and resumes from the last checkpoint (``--resume``).
"""

from __future__ import annotations

import csv
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.data import Dataset, read_leaf
from device.errors import ConfigError
from server.coordinator.coordinator import Coordinator, CoordinatorConfig, RoundMetrics
from server.strategies import make_strategy
from server.strategies.base import TrainConfig

log = logging.getLogger("covey.server")


@dataclass
class ServeOptions:
    run: str
    host: str
    port: int
    strategy: str
    strategy_params: dict[str, Any]
    model_path: Path
    rounds: int
    min_devices: int
    state_dir: Path
    eval_dir: Path | None = None
    epochs: int = 1
    batch: int = 5
    lr: float = 0.01
    handoff: str = "auto"
    deadline_s: float = 120.0
    seed: int = 0
    register_timeout: float = 300.0
    resume: bool = False
    advertise: bool = False


def leaf_eval_set(root: Path) -> Dataset:
    """The server's held-out set: every writer's test split of a LEAF folder."""
    folder = root / "test" if (root / "test").is_dir() else root
    test = read_leaf(folder)
    if not test:
        raise ConfigError(f"{folder} holds no users")
    return Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))


def write_metrics(metrics: list[RoundMetrics], out: Path) -> None:
    rows = [asdict(m) for m in metrics]
    flat = [
        {k: (v if not isinstance(v, dict) else ";".join(f"{a}={b}" for a, b in v.items())) for k, v in r.items()}
        for r in rows
    ]
    if flat:
        with (out / "metrics.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(flat[0]))
            writer.writeheader()
            writer.writerows(flat)


def plot_accuracy(metrics: list[RoundMetrics], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    rounds = [m.round for m in metrics]
    ax[0].plot(rounds, [100 * m.test_accuracy for m in metrics], marker="o")
    ax[0].set(xlabel="round", ylabel="server-side test accuracy (%)", title=title)
    ax[1].plot(rounds, [m.test_loss for m in metrics], marker="o", label="test")
    ax[1].plot(rounds, [m.train_loss for m in metrics], marker="o", label="train (devices)")
    ax[1].set(xlabel="round", ylabel="loss")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def serve(opts: ServeOptions, *, progress: bool = True) -> Coordinator:
    train = TrainConfig(epochs=opts.epochs, batch_size=opts.batch, lr=opts.lr)
    strategy = make_strategy(opts.strategy, train=train, **opts.strategy_params)
    eval_data = leaf_eval_set(opts.eval_dir) if opts.eval_dir else None
    coord = Coordinator(
        CoordinatorConfig(
            opts.run,
            opts.host,
            opts.port,
            opts.state_dir,
            handoff=opts.handoff,
            deadline_s=opts.deadline_s,
            seed=opts.seed,
        ),
        strategy,
        opts.model_path,
        eval_data,
    )
    zc = None
    try:
        coord.connect()
        if opts.advertise:
            from device.discovery import advertise

            zc = advertise(opts.run, opts.host, opts.port)
        resumed = opts.resume and coord.resume()
        from tqdm import tqdm

        with tqdm(total=opts.min_devices, desc="devices registered", unit="device", disable=not progress) as bar:

            def registered(n: int) -> None:
                bar.n = n
                bar.refresh()

            coord.wait_for_devices(opts.min_devices, opts.register_timeout, progress=registered)
        coord.measure_rtt()
        if not resumed:
            coord.setup_strategy()
        with tqdm(
            total=opts.rounds, initial=coord.round, desc=f"{opts.strategy} rounds", unit="round", disable=not progress
        ) as bar:
            while coord.round < opts.rounds:
                m = coord.step()
                write_metrics(coord.metrics, opts.state_dir)
                bar.update(1)
                bar.set_postfix(acc=f"{m.test_accuracy:.3f}", trained=m.trained, skipped=m.skipped)
        plot_accuracy(coord.metrics, opts.state_dir / "accuracy.png", f"{opts.strategy} over MQTT ({opts.run})")
        coord.stop_devices()
        time.sleep(0.3)
        return coord
    finally:
        if zc is not None:
            zc.close()
        coord.close()
