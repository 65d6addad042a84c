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
from device.protocol import EvalRow, FrameCodec, LocalTraining, Split, decode, encode_float
from device.runtime import TFLiteModel
from device.training import evaluate_loaded, pretrain_locally, train_locally
from server.hops import HopBound
from server.simulation.datasets import ClientData
from server.simulation.faults import Faults
from server.simulation.wire import frame_bytes
from server.strategies.base import MemberResult


@dataclass(frozen=True)
class ChainOutcome:
    final_weights: np.ndarray
    members: tuple[MemberResult, ...]
    wire_bytes: int = 0  # the hand-offs' frames (the last one: to the manager)
    handed_on: int = 0  # of those, the frames the next member received
    refused: tuple[str, ...] = ()  # members whose hand-off was refused (server/hops.py)


class Trainer:
    """Trains, evaluates and pre-trains virtual devices with one interpreter."""

    def __init__(
        self, model_path: Path | str, data: Mapping[str, ClientData], threads: int = 1, faults: Faults | None = None
    ) -> None:
        # one interpreter loads a model per task: released pages would fault back in at each load
        self.model = TFLiteModel(model_path, num_threads=threads, release_memory=False)
        self.data = data
        self.faults = faults or Faults()  # poisoners scale what they return (server/simulation/faults.py)

    def chain(
        self,
        weights: np.ndarray,
        members: Sequence[str],
        settings: LocalTraining,
        seed: int,
        rnd: int,
        codec: FrameCodec = "raw",
        resend: bool = False,
        hop: HopBound | None = None,
    ) -> ChainOutcome:
        """Members train one after another, each from its predecessor's model as it
        arrives in ``codec`` (a full-model codec: hand-offs as on boards).

        ``resend``: the last member's successor is silent, so (as the coordinator's
        manager asks) the member sends its output again to the manager as float32: the
        outcome's model is that output itself, not its hand-off in ``codec`` (which is
        counted, sent to the silent successor).

        ``hop``: the bound on each hand-off, as the group manager checks a relayed one
        (:mod:`server.hops`); a member whose output it refuses, or whose output is not
        finite, is not credited and the chain goes on from that member's input (the
        manager forwards its input to the successor: the same frame size)."""
        current = weights
        out = []
        refused = []
        sent = handed_on = 0
        for i, c in enumerate(members):
            try:
                res = train_locally(
                    self.model, self.data[c].train, settings, start=current, seed=seed, rnd=rnd, device_id=c
                )
            except WeightsError:  # diverged: the board sends `failed`, the manager passes it over
                refused.append(c)
                continue
            trained = self.faults.poisoned(c, current, res.weights, rnd)
            if hop is not None:
                checked, _ = hop.check(current, trained)
            else:
                checked = trained if bool(np.isfinite(trained).all()) else None
            payload = encode_float(checked if checked is not None else current, codec)  # the same size
            size = frame_bytes(payload, codec)
            sent += size
            handed_on += size if i < len(members) - 1 else 0
            if checked is None:
                refused.append(c)
                continue
            current = checked if resend and i == len(members) - 1 else decode(payload, codec)
            out.append(MemberResult(c, self.faults.claimed(c, res.n_samples), res.loss))
        return ChainOutcome(current, tuple(out), sent, handed_on, tuple(refused))

    def parallel(self, weights: np.ndarray, client: str, settings: LocalTraining, seed: int, rnd: int) -> MemberResult:
        try:
            res = train_locally(
                self.model, self.data[client].train, settings, start=weights, seed=seed, rnd=rnd, device_id=client
            )
        except WeightsError:  # diverged: a non-finite model, which screening always refuses
            nan = np.full(weights.shape, np.nan, np.float32)
            return MemberResult(client, len(self.data[client].train.y), float("nan"), nan)
        claimed = self.faults.claimed(client, res.n_samples)
        return MemberResult(client, claimed, res.loss, self.faults.poisoned(client, weights, res.weights, rnd))

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
