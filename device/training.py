"""What a device computes for a request, written once for boards and the simulator.

The agent (``device/agent.py``) and the simulator's virtual devices
(``server/simulation/trainer.py``) both call these functions, so a strategy run in
simulation and over MQTT trains, pre-trains and evaluates bit for bit alike.

The seed rule (also in ``docs/protocol.md``, so a third-party device can train
identically): a task's batch order comes from numpy's default generator (PCG64)
seeded with the sequence ``[seed, round, key, purpose]``, where ``seed`` is the
request's seed, ``round`` the message's round, ``key`` the first 8 bytes of
``sha256(device id)`` read as a little-endian unsigned integer, and ``purpose`` 0 for
training and 1 for pre-training. Each epoch takes ``rng.permutation(n)`` and cuts it
into mini-batches of ``batch`` samples, the last partial one included.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from device.data import Dataset
from device.errors import WeightsError
from device.protocol.messages import EvalRow, LocalTraining
from device.runtime import TFLiteModel


class Purpose(IntEnum):
    TRAIN = 0
    PRETRAIN = 1


def device_key(device_id: str) -> int:
    """The device's part of every seed: first 8 bytes of sha256(id), little-endian."""
    return int.from_bytes(hashlib.sha256(device_id.encode()).digest()[:8], "little")


def task_rng(seed: int, rnd: int, device_id: str, purpose: Purpose) -> np.random.Generator:
    """The generator of one task's batch order (see the module docstring)."""
    return np.random.default_rng([int(seed), int(rnd), device_key(device_id), int(purpose)])


@dataclass(frozen=True)
class TrainOutcome:
    weights: np.ndarray
    n_samples: int
    loss: float  # sample-weighted mean of the mini-batch losses; NaN without data
    steps: int


def train_locally(
    model: TFLiteModel,
    data: Dataset,
    settings: LocalTraining,
    *,
    start: np.ndarray,
    seed: int,
    rnd: int,
    device_id: str,
    reuse_start: bool = False,
) -> TrainOutcome:
    """Local SGD (FedProx with ``settings.mu > 0``) from ``start`` on ``data``;
    ``reuse_start``: the caller gives ``start`` up and the result may take its buffer.
    Training whose loss is NaN or infinite diverged (:class:`WeightsError`), even with
    finite weights: no result could report it, and its model is not one to hand on."""
    if len(data) == 0:
        return TrainOutcome(np.asarray(start, np.float32), 0, float("nan"), 0)
    res = model.train(
        data.x,
        data.y,
        epochs=settings.epochs,
        batch_size=settings.batch,
        lr=settings.lr,
        mu=settings.mu,
        max_steps=settings.max_steps,
        seed=task_rng(seed, rnd, device_id, Purpose.TRAIN),
        initial_weights=start,
        reuse_start=reuse_start,
    )
    if not math.isfinite(res.mean_loss):
        raise WeightsError("training diverged: the loss became NaN or infinite; lower the learning rate")
    return TrainOutcome(res.weights, res.n_samples, res.mean_loss, res.n_steps)


def pretrain_epochs(steps: int, n_samples: int, batch: int) -> int:
    """Epochs that hold ``steps`` mini-batch steps (pre-training stops at ``steps``)."""
    per_epoch = max(1, math.ceil(n_samples / batch))
    return max(1, math.ceil(steps / per_epoch))


def pretrain_locally(
    model: TFLiteModel,
    data: Dataset,
    *,
    steps: int,
    batch: int,
    lr: float,
    start: np.ndarray,
    seed: int,
    rnd: int,
    device_id: str,
) -> tuple[np.ndarray, TrainOutcome]:
    """``steps`` plain SGD steps from ``start`` (epochs as needed); returns the update
    ``trained - start`` and the outcome (cold start of FedGroup / FlexCFL)."""
    start = np.asarray(start, np.float32)
    if len(data) == 0:
        return np.zeros_like(start), TrainOutcome(start, 0, float("nan"), 0)
    settings = LocalTraining(pretrain_epochs(steps, len(data), batch), batch, lr, 0.0, steps)
    res = model.train(
        data.x,
        data.y,
        epochs=settings.epochs,
        batch_size=batch,
        lr=lr,
        max_steps=steps,
        seed=task_rng(seed, rnd, device_id, Purpose.PRETRAIN),
        initial_weights=start,
    )
    update = (res.weights - start).astype(np.float32)
    return update, TrainOutcome(res.weights, res.n_samples, res.mean_loss, res.n_steps)


def evaluate_locally(model: TFLiteModel, data: Dataset, models: Sequence[np.ndarray]) -> list[EvalRow]:
    """Each model's mean loss, correct count and sample count on ``data``."""
    rows = []
    for index, weights in enumerate(models):
        if len(data):
            model.set_weights(weights)
        rows.append(evaluate_loaded(model, data, index))
    return rows


def evaluate_loaded(model: TFLiteModel, data: Dataset, index: int) -> EvalRow:
    """The row of model ``index`` on ``data``, with that model's weights already loaded
    (the simulator loads a model once and scores many virtual devices with it)."""
    if len(data) == 0:
        return EvalRow(index, 0.0, 0, 0)
    ev = model.evaluate(data.x, data.y)
    return EvalRow(index, float(ev.loss), int(ev.n_correct), int(ev.n_samples))
