"""The server's own update: what one honest device's training looks like this round.

A reference for screening (:mod:`server.screening`) that no device can poison: from the
round's start model, the server trains one local update with the round's settings on
a sample of its own held-out data (the set it scores the global model on, the
coordinator's ``--eval-data``), as large as the median registered device, and
returns its norm. This is the trust bootstrap of FLTrust (Cao, Fang, Liu and Gong,
"FLTrust: Byzantine-robust Federated Learning via Trust Bootstrapping", NDSS 2021),
which scales every client update to the norm of the server's update on a small clean
root set; covey uses that norm as one entry of the reference, so that a round with a
single chain, or two, still has a bound before any history exists. The sample and the
batch order are fixed by the run's seed (the seed rule of ``device/training.py`` with
the id ``server-reference``), so simulation and boards compute the same value.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from device.data import Dataset
from device.protocol import LocalTraining
from device.runtime import TFLiteModel
from device.training import train_locally
from server.screening import update_norm
from server.strategies.base import RoundPlan

REFERENCE_ID = "server-reference"  # the device id in the seed rule
ServerNormFn = Callable[[np.ndarray, RoundPlan, int, int], float]


class ServerReference:
    """Trains the server's reference update on ``data`` with its own interpreter.

    Parameters
    ----------
    model_path : the run's ``.tflite`` (manifest beside it).
    data : the server's held-out data.
    """

    def __init__(self, model_path: Path | str, data: Dataset) -> None:
        self.model = TFLiteModel(model_path, num_threads=1, release_memory=False)
        self.data = data
        self._order = np.random.default_rng(0).permutation(len(data))

    def norm(self, start: np.ndarray, settings: LocalTraining, *, seed: int, rnd: int, n_samples: int) -> float:
        """``||w - start||`` after local training on ``n_samples`` of the server's data
        (all of it if it holds fewer); NaN without data."""
        n = int(min(max(n_samples, 1), len(self.data)))
        if n == 0:
            return float("nan")
        pick = np.sort(self._order[:n])
        sample = Dataset(self.data.x[pick], self.data.y[pick])
        out = train_locally(self.model, sample, settings, start=start, seed=seed, rnd=rnd, device_id=REFERENCE_ID)
        return update_norm(start, out.weights)


def server_norm(model_path: Path | str, data: Dataset) -> ServerNormFn:
    """The driver's ``reference``: the norm of the server's update for a plan's start
    model, with the plan's training settings, the run's seed and round."""
    ref = ServerReference(model_path, data)

    def norm(start: np.ndarray, plan: RoundPlan, seed: int, n_samples: int) -> float:
        return ref.norm(start, plan.train.to_wire(), seed=seed, rnd=plan.round, n_samples=n_samples)

    return norm
