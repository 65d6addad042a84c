"""Does this board train? ``python -m device.train_check MODEL.tflite [...]``

Loads each model with this board's interpreter, trains it a few SGD steps on the given
data (a ``.npz`` with ``x`` and ``y``, e.g. the board's own training data) and prints
one JSON line per model: the interpreter, the machine, the mean training loss, the loss
and accuracy after training, and samples per second. A model the agent downloaded lies
in its state folder, so on a board::

    /opt/covey/venv/bin/python -m device.train_check /var/lib/covey/ID/*.tflite --data train.npz

The same data, seed and steps give the same losses on every machine up to float
rounding; covey's tests compare an emulated ARM board's lines with x86's this way.
One thread by default, so the order of every sum is fixed. A mistake is one line and
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import CoveyError, DataError


def _data(path: Path, input_shape: tuple[int, ...], n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as arrays:
            x, y = arrays["x"], arrays["y"]
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"{path}: not an .npz with arrays x and y ({exc})") from None
    x = np.asarray(x, np.float32).reshape((-1, *input_shape))
    return x, np.asarray(y, np.int32) % n_classes


def check(
    model_path: Path,
    data: Path,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    threads: int,
    backend: str | None,
) -> dict[str, Any]:
    """Train ``model_path`` ``steps`` steps on ``data``; what happened, as a dict.

    A model file without initial weights (what the agent downloads: the server sends
    weights with each task) starts from small normal weights drawn with ``seed``."""
    from device.runtime import TFLiteModel

    model = TFLiteModel(model_path, num_threads=threads, backend=backend)
    x, y = _data(data, model.manifest.input_shape, model.manifest.n_classes)
    start = None
    if not model.manifest.initial_weights:
        rng = np.random.default_rng(seed)
        start = rng.normal(0.0, 0.05, model.n_params).astype(np.float32)
    started = time.perf_counter()
    result = model.train(x, y, epochs=1_000, batch_size=batch, lr=lr, max_steps=steps, seed=seed, initial_weights=start)
    seconds = time.perf_counter() - started
    after = model.evaluate(x, y)
    return {
        "model": model.manifest.model,
        "machine": platform.machine(),
        "backend": model.backend.name,
        "backend_version": str(model.backend.version),
        "steps": result.n_steps,
        "train_loss": float(result.mean_loss),
        "loss_after": float(after.loss),
        "accuracy_after": float(after.accuracy),
        "samples_per_s": result.n_steps * batch / seconds if seconds > 0 else float("nan"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m device.train_check", description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", type=Path, help=".tflite files (each with its .json manifest beside it)")
    p.add_argument("--data", type=Path, required=True, help=".npz with x (samples) and y (labels)")
    p.add_argument("--steps", type=int, default=5, help="SGD steps (default 5)")
    p.add_argument("--batch", type=int, default=10, help="batch size (default 10)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="batch order seed (default 0)")
    p.add_argument("--threads", type=int, default=1, help="interpreter threads (default 1)")
    p.add_argument("--backend", help="ai_edge_litert, tflite_runtime or tensorflow (default: the first installed)")
    args = p.parse_args(argv)
    try:
        for path in args.models:
            line = check(
                path,
                args.data,
                steps=args.steps,
                batch=args.batch,
                lr=args.lr,
                seed=args.seed,
                threads=args.threads,
                backend=args.backend,
            )
            print(json.dumps(line), flush=True)
    except CoveyError as exc:
        print(f"train_check: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
