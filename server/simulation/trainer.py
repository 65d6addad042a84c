"""Virtual devices: the device code of ``device/training.py`` over many clients' data.

One :class:`Trainer` (one interpreter) serves the virtual devices of a worker (the
process, one of its threads, or a worker process), one work unit at a time: a work
unit loads the client's starting weights and runs the very function a board runs for
the same request (same seed rule, same batches, same pre-training steps, same
evaluation). Work units are pure functions of their inputs (weights, client id, seed,
round), so any number of workers gives the same results as one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device.data import Dataset
from device.errors import WeightsError
from device.protocol import EvalRow, LocalTraining, Split
from device.runtime import TFLiteModel
from device.training import TrainOutcome, evaluate_loaded, pretrain_locally, train_locally
from server.simulation.datasets import ClientData
from server.simulation.faults import Faults


@dataclass(frozen=True)
class Trained:
    """What a virtual device's training gave: its outcome as the device reports it (a
    poisoner's output and claimed sample count included), or None when training
    diverged (the device reports ``failed``, as a board does)."""

    outcome: TrainOutcome | None
    failure: str = ""


class Trainer:
    """Trains, evaluates and pre-trains virtual devices with one interpreter."""

    def __init__(
        self, model_path: Path | str, data: Mapping[str, ClientData], threads: int = 1, faults: Faults | None = None
    ) -> None:
        # one interpreter loads a model per task: released pages would fault back in at each load
        self.model = TFLiteModel(model_path, num_threads=threads, release_memory=False)
        self.data = data
        self.faults = faults or Faults()  # poisoners scale what they return (server/simulation/faults.py)

    def train(self, weights: np.ndarray, client: str, settings: LocalTraining, seed: int, rnd: int) -> Trained:
        """What ``client``'s board computes for a train request whose model arrived as
        ``weights`` (:func:`~device.training.train_locally`, the call
        ``device/tasks.py`` makes), with this run's faults applied to what it reports."""
        try:
            out = train_locally(
                self.model, self.data[client].train, settings, start=weights, seed=seed, rnd=rnd, device_id=client
            )
        except WeightsError as exc:  # diverged: the board reports `failed` and sends no model
            return Trained(None, str(exc)[:300])
        poisoned = self.faults.poisoned(client, weights, out.weights, rnd)
        return Trained(TrainOutcome(poisoned, self.faults.claimed(client, out.n_samples), out.loss, out.steps))

    def pretrain(
        self, weights: np.ndarray, client: str, steps: int, batch: int, lr: float, seed: int, rnd: int
    ) -> np.ndarray:
        """``steps`` mini-batch steps from ``weights``; returns the update."""
        update, _ = pretrain_locally(
            self.model,
            self.data[client].train,
            steps=steps,
            batch=batch,
            lr=lr,
            start=weights,
            seed=seed,
            rnd=rnd,
            device_id=client,
        )
        factor = self.faults.scale.get(client)
        return update if factor is None else (update * np.float32(factor)).astype(np.float32)

    def evaluate(self, models: Sequence[np.ndarray], clients: Sequence[str], split: Split) -> dict[str, list[EvalRow]]:
        """Per client: one row per model, on the client's ``split`` (each model loaded
        once for every client: the rows of :func:`~device.training.evaluate_locally`)."""
        rows: dict[str, list[EvalRow]] = {c: [] for c in clients}
        for index, weights in enumerate(models):
            if any(len(getattr(self.data[c], split)) for c in clients):
                self.model.set_weights(weights)
            for c in clients:
                rows[c].append(evaluate_loaded(self.model, getattr(self.data[c], split), index))
        return rows


def server_evaluator(model_path: Path | str, data: Dataset) -> Callable[[np.ndarray], tuple[float, float]]:
    """Accuracy and loss of a global model on a held-out set the server owns (what the
    coordinator scores with ``--eval-data``), for :class:`~server.simulation.engine.Simulation`."""
    model = TFLiteModel(model_path, num_threads=1, release_memory=False)

    def evaluate(weights: np.ndarray) -> tuple[float, float]:
        model.set_weights(weights)
        result = model.evaluate(data.x, data.y)
        return result.accuracy, result.loss

    return evaluate
