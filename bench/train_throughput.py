"""Training throughput of covey's LiteRT train signature against Keras, per zoo model.

For every model and batch size, in one run: samples/s of the LiteRT ``train``
signature driven by the device runtime (``TFLiteModel.train``: shuffled mini-batches
from a local data set), and samples/s of the same architecture trained with Keras
``train_on_batch`` (SGD, same batch size, same number of threads, same CPU). Each
side runs in its own child process, alternating, ``--repeats`` times, and the ratio
compares the best run of each side. The development machine is a shared VM whose
speed can halve for seconds at a time with nothing else running (docs/results.md
describes the machine). Such interference only ever slows a run down, so the best of
several short alternating runs estimates each side's undisturbed speed alike; the
ratio of medians is printed beside it and kept in ``--json``. The LiteRT child never
imports TensorFlow, and it does what a device does: it loads the artifact devices download (the model without initial
values, ``server/artifact.py``), sets the start weights a train request brings, and
trains into their buffer (``reuse_start``), as an agent does when nothing needs the start
model afterwards (fp32 and fp16 runs; ``discard_start`` in docs/protocol.md). Its peak RSS
is the peak memory of a device-side training process.

Prints one line per figure::

    figure train_ratio_<model>_b<batch> = <LiteRT samples/s ÷ Keras samples/s>
    figure train_peak_rss_mb_<model> = <MB>

Usage: ``python bench/train_throughput.py [--models a,b] [--batches 5,10,32]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _data(input_shape: tuple[int, ...], n_classes: int, n: int = 4096):  # type: ignore[no-untyped-def]
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((n, *input_shape), dtype=np.float32)
    y = rng.integers(0, n_classes, n).astype(np.int32)
    return x, y


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). ``ru_maxrss`` would not do: Linux
    carries it over fork and exec from the parent, which imported TensorFlow."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _litert_child(model_path: str, start_path: str, batch: int, threads: int, seconds: float, queue: mp.Queue) -> None:
    import numpy as np

    from device.runtime import TFLiteModel

    model = TFLiteModel(model_path, num_threads=threads)
    x, y = _data(model.manifest.input_shape, model.manifest.n_classes)
    start_weights = np.load(start_path)
    # warm-up (tensor allocation) from the start weights, as a train request brings them;
    # the result takes their buffer, as on a device that needs the start model no more
    model.train(x, y, batch_size=batch, lr=0.001, max_steps=5, seed=0, initial_weights=start_weights, reuse_start=True)
    del start_weights
    steps = 10
    result = None
    while True:
        result = None  # a device holds one round's result at a time, not the last run's too
        start = time.perf_counter()
        result = model.train(x, y, epochs=1000, batch_size=batch, lr=0.001, max_steps=steps, seed=1)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
        steps = max(steps * 2, int(steps * seconds / max(elapsed, 1e-3) * 1.1))
    rss_mb = _peak_rss_mb()
    queue.put({"sps": result.n_steps * batch / elapsed, "rss_mb": rss_mb, "backend": model.backend.name})


def _keras_child(name: str, batch: int, threads: int, seconds: float, queue: mp.Queue) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras

    from models.keras_reference import keras_model
    from models.zoo import get_architecture

    arch = get_architecture(name)
    model = keras_model(arch)
    model.compile(
        optimizer=keras.optimizers.SGD(0.001),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = _data(arch.input_shape, arch.n_classes)
    batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x) - batch + 1, batch)]
    for i in range(5):
        model.train_on_batch(*batches[i])
    steps = 10
    while True:
        start = time.perf_counter()
        for i in range(steps):
            model.train_on_batch(*batches[i % len(batches)])
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
        steps = max(steps * 2, int(steps * seconds / max(elapsed, 1e-3) * 1.1))
    queue.put({"sps": steps * batch / elapsed})


def _device_artifact(model_path: Path, out_dir: Path) -> tuple[Path, Path]:
    """The stripped model a device downloads, and the model's initial weights as the
    start weights a train request would bring."""
    import numpy as np

    from device.runtime import TFLiteModel
    from server.artifact import write_device_artifact

    artifact = write_device_artifact(model_path, out_dir)
    start = out_dir / f"{model_path.stem}.start.npy"
    np.save(start, TFLiteModel(model_path, num_threads=1).get_weights())
    return artifact, start


def _run(target, *args) -> dict:  # type: ignore[no-untyped-def]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get(timeout=900)
    proc.join(timeout=60)
    return dict(result)


def main() -> int:
    from covey.paths import ensure_model
    from models.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated zoo names")
    parser.add_argument("--batches", default="5,10,32")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write all measurements to this file")
    args = parser.parse_args()

    names = [n for n in args.models.split(",") if n]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"# threads={args.threads} seconds={args.seconds} repeats={args.repeats} cpu={os.cpu_count()}")
    rows = []
    workdir = tempfile.TemporaryDirectory(prefix="covey-bench-")
    for name in names:
        path, start = _device_artifact(ensure_model(name), Path(workdir.name))
        peak = 0.0
        for batch in batches:
            lite, ker, batch_peak = [], [], 0.0
            for _ in range(args.repeats):
                res = _run(_litert_child, str(path), str(start), batch, args.threads, args.seconds)
                lite.append(res["sps"])
                batch_peak = max(batch_peak, res["rss_mb"])
                ker.append(_run(_keras_child, name, batch, args.threads, args.seconds)["sps"])
            peak = max(peak, batch_peak)
            ratio = max(lite) / max(ker)
            median_ratio = statistics.median(lite) / statistics.median(ker)
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "litert_sps": lite,
                    "keras_sps": ker,
                    "ratio": ratio,
                    "median_ratio": median_ratio,
                }
            )
            print(
                f"# {name} b{batch}: best LiteRT {max(lite):,.0f} samples/s, Keras {max(ker):,.0f} samples/s "
                f"(medians {statistics.median(lite):,.0f} / {statistics.median(ker):,.0f}, "
                f"ratio {median_ratio:.3f}), LiteRT peak RSS {batch_peak:.0f} MB",
                flush=True,
            )
            print(f"figure train_ratio_{name}_b{batch} = {ratio:.3f}", flush=True)
        print(f"figure train_peak_rss_mb_{name} = {peak:.1f}", flush=True)
        rows.append({"model": name, "peak_rss_mb": peak})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
