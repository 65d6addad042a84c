"""covey's agent as a model poisoner: every trained model it sends is its honest update
boosted by ``COVEY_POISON_SCALE`` (default 100), ``start + scale (trained - start)``:
the explicit boosting of Bhagoji et al. (ICML 2019), as ``server/simulation/faults.py``
does for virtual devices. Everything else (protocol, frames, identity) is the real
agent, so only screening can tell it apart.

Run like covey-device, with the repository on ``PYTHONPATH`` (``server/fleet.py`` sets
it): ``python tests/mqtt/poisoning_agent.py --broker ... --run ... --id ...``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Any

import numpy as np

from device import cli, tasks
from device.training import train_locally
from server.simulation.faults import scale_update

SCALE = float(os.environ.get("COVEY_POISON_SCALE", "100"))
_train = tasks.TaskRunner.train


def _boosted_train(self: tasks.TaskRunner, request: Any, rnd: int, weights: np.ndarray, *rest: Any) -> None:
    in_worker = self._in_worker
    start = weights.copy()  # the runner may train into the start model's buffer (reuse_start)

    def boosted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        out = in_worker(fn, *args, **kwargs)
        if fn is train_locally:  # the trained model, before it is handed on or returned
            return replace(out, weights=scale_update(start, out.weights, SCALE))
        return out

    self._in_worker = boosted
    try:
        _train(self, request, rnd, weights, *rest)  # rest: whatever else the runner takes (the payload key)
    finally:
        self._in_worker = in_worker


tasks.TaskRunner.train = _boosted_train  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
