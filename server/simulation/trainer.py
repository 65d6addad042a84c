"""Virtual devices: the LiteRT runtime of ``device/`` training many clients in turn.

One :class:`TFLiteModel` (one interpreter) serves every virtual device of a process:
the client's starting weights are loaded, its local epochs run through the model's
real ``train`` signature, and the weights are read back. Work units are pure
functions of their inputs (weights, client id, seed), so a pool of processes gives
the same results as one process.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device.runtime import TFLiteModel
from server.simulation.datasets import ClientData
from server.strategies.base import MemberResult, TrainConfig


@dataclass(frozen=True)
class ChainOutcome:
    final_weights: np.ndarray
    members: tuple[MemberResult, ...]


def client_seed(seed: int, rnd: int, client_id: str, purpose: int = 0) -> np.random.Generator:
    """A generator that depends only on (seed, round, client, purpose), not on which
    process runs the work, so pools of any size give identical results."""
    key = int.from_bytes(hashlib.sha256(client_id.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, rnd, key, purpose])


class Trainer:
    """Trains, evaluates and pre-trains virtual devices with one interpreter."""

    def __init__(self, model_path: Path | str, data: Mapping[str, ClientData], threads: int = 1) -> None:
        self.model = TFLiteModel(model_path, num_threads=threads)
        self.data = data

    def _train_one(
        self, weights: np.ndarray, client: str, cfg: TrainConfig, rng: np.random.Generator, max_steps: int | None
    ) -> tuple[np.ndarray, float, int]:
        d = self.data[client].train
        if len(d) == 0:
            return weights, float("nan"), 0
        res = self.model.train(
            d.x,
            d.y,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            mu=cfg.mu,
            max_steps=max_steps,
            seed=rng,
            initial_weights=weights,
        )
        return res.weights, res.mean_loss, len(d)

    def chain(self, weights: np.ndarray, members: Sequence[str], cfg: TrainConfig, seed: int, rnd: int) -> ChainOutcome:
        """Members train one after another, each from its predecessor's model."""
        current = weights
        out = []
        for c in members:
            current, loss, n = self._train_one(current, c, cfg, client_seed(seed, rnd, c), cfg.max_steps)
            out.append(MemberResult(c, n, loss))
        return ChainOutcome(current, tuple(out))

    def parallel(self, weights: np.ndarray, client: str, cfg: TrainConfig, seed: int, rnd: int) -> MemberResult:
        new, loss, n = self._train_one(weights, client, cfg, client_seed(seed, rnd, client), cfg.max_steps)
        return MemberResult(client, n, loss, new)

    def pretrain(self, weights: np.ndarray, client: str, steps: int, cfg: TrainConfig, seed: int) -> np.ndarray:
        """``steps`` mini-batch steps from ``weights``; returns the update."""
        rng = client_seed(seed, 0, client, purpose=1)
        new, _, _ = self._train_one(weights, client, TrainConfig(1000, cfg.batch_size, cfg.lr), rng, steps)
        return new - weights

    def evaluate(
        self, weights: np.ndarray, clients: Sequence[str], split: str = "test"
    ) -> list[tuple[float, int, int]]:
        """(loss, correct, n) per client with one model."""
        self.model.set_weights(weights)
        out = []
        for c in clients:
            d = getattr(self.data[c], split)
            if len(d) == 0:
                out.append((0.0, 0, 0))
                continue
            r = self.model.evaluate(d.x, d.y)
            out.append((r.loss, r.n_correct, r.n_samples))
        return out


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))
