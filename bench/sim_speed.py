"""Simulation speed: ``covey simulate`` against Flower's simulation engine, and two workers against one.

The task (issue 14): FedAvg, the MLP 784-512-62, the 51 FEMNIST writers of the shared
LEAF sample, 10 clients per round, 30 rounds, every writer scored every round
(federated evaluation), local training as covey's FedAvg default (1 epoch, batch 10,
SGD at lr 0.01), same initial weights (the zoo model's).

covey runs as a user runs it: ``python -m covey.cli simulate ...`` in a child process,
timed from spawn to exit (imports, data, simulation, writing JSON, CSV and plot). One
warm-up run first fills the parsed-data cache (it is reported, not counted). Its
steady-state seconds per round is the median of the rounds' ``wall_s`` in the run's
JSON, the first round left out. ``--workers 1`` and ``--workers 2`` alternate.

With ``--with-flower``, the benchmark installs ``flwr[simulation]`` and CPU PyTorch
into its own virtualenv (``~/.cache/covey-bench/flower-venv``, once) and runs
``bench/sim_speed_flower.py`` there, alternating with the covey runs: FedAvg with a
PyTorch client as in Flower's quickstart on the same writers (exported from covey's
parsed data, so Flower parses no JSON), one CPU per Ray actor, every writer evaluated
every round. Its round time is the time between consecutive ends of round (the
server's ``aggregate_evaluate``). Before timing, one check runs on one writer: the
PyTorch MLP loaded with covey's initial weights gives covey's logits, and one SGD step
on a 10-sample batch gives covey's weights, to a stated tolerance.

Prints::

    figure sim_covey_wall_s = ...            (median, whole process, --workers 1)
    figure sim_covey_round_s = ...           (median steady-state seconds per round)
    figure sim_workers2_speedup = ...        (seconds per round, one worker ÷ two)
    figure sim_workers2_wall_speedup = ...   (whole process, one worker ÷ two)
    figure sim_vs_flower_wall_ratio = ...    (covey ÷ Flower, whole process; --with-flower)
    figure sim_vs_flower_round_ratio = ...   (covey ÷ Flower, seconds per round; --with-flower)
    figure sim_vs_flower_wall_ratio_workers2 = ...   (the same with --workers 2, covey's default
    figure sim_vs_flower_round_ratio_workers2 = ...   on two cores: one worker per core, at most 4)

``--eval-every N`` runs both sides scoring the writers every N rounds (and after the
last; 0: never) instead, to see what the per-round evaluation costs each side.

Usage: ``python bench/sim_speed.py [--repeats 3] [--with-flower] [--eval-every N]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ROUNDS, CLIENTS_PER_ROUND, MODEL = 30, 10, "mlp_femnist"
EPOCHS, BATCH, LR = 1, 10, 0.01  # covey's FedAvg defaults (server/settings.py), set explicitly for both sides
TOLERANCE = 1e-5  # max |Δ| of logits and of weights after one step (float32, other summation order)
VENV = Path.home() / ".cache" / "covey-bench" / "flower-venv"
FLOWER_PACKAGES = (["torch==2.13.0+cpu"], ["flwr[simulation]"])  # the CPU wheel first: no CUDA downloads


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}


def covey_run(workers: int, out: Path, eval_every: int = 1) -> tuple[float, float]:
    """(whole-process seconds, median seconds per round after the first)."""
    cmd = [
        sys.executable, "-m", "covey.cli", "simulate", "--strategy", "fedavg", "--dataset", "femnist",
        "--model", MODEL, "--clients-per-round", str(CLIENTS_PER_ROUND), "--rounds", str(ROUNDS),
        "--epochs", str(EPOCHS), "--batch", str(BATCH), "--lr", str(LR), "--seed", "0",
        "--workers", str(workers), "--federated-eval-every", str(eval_every), "--out", str(out),
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, env=_env(), check=True, capture_output=True)
    wall = time.perf_counter() - start
    rounds = json.loads((out / "fedavg_femnist_seed0.json").read_text())["rounds"]
    return wall, statistics.median(r["wall_s"] for r in rounds[1:])


# -- Flower --------------------------------------------------------------------------------------


def flower_python() -> Path:
    """The Flower virtualenv's python, installing it on first use."""
    python = VENV / "bin" / "python"
    marker = VENV / ".covey-bench-ready"
    if marker.exists():
        return python
    print(f"installing flwr[simulation] and CPU PyTorch into {VENV} (once) ...", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    for packages in FLOWER_PACKAGES:
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"could not install {' '.join(packages)} into {VENV}:\n{done.stderr[-2000:]}")
    marker.write_text("ok\n")
    return python


def export_for_flower(tmp: Path) -> tuple[Path, Path, Path]:
    """The writers' arrays, covey's initial weights and one check batch, as .npz files."""
    from covey.paths import ensure_model, femnist_dir
    from device.runtime import TFLiteModel
    from server.simulation.datasets import leaf

    fed = leaf(femnist_dir())
    users = sorted(fed)
    arrays: dict[str, np.ndarray] = {"users": np.array(users, dtype=np.str_)}
    for i, u in enumerate(users):
        for part in ("train", "test"):
            d = getattr(fed[u], part)
            arrays[f"{part}_x_{i}"], arrays[f"{part}_y_{i}"] = d.x, d.y
    np.savez(tmp / "femnist.npz", **arrays)
    model = TFLiteModel(ensure_model(MODEL))
    init = model.get_weights()
    layout = model.manifest.tensors
    tensors = {f"w{i}": init[t.offset : t.offset + t.size].reshape(t.shape) for i, t in enumerate(layout)}
    np.savez(tmp / "init.npz", **tensors)
    first = fed[users[0]].train
    np.savez(tmp / "batch.npz", x=first.x[:BATCH], y=first.y[:BATCH])
    return tmp / "femnist.npz", tmp / "init.npz", tmp / "batch.npz"


def check_one_step(python: Path, init: Path, batch: Path, tmp: Path) -> tuple[float, float]:
    """max |Δ| of the logits at the initial weights and of the weights after one SGD step."""
    from covey.paths import ensure_model
    from device.runtime import TFLiteModel

    out = tmp / "torch_step.npz"
    subprocess.run(
        [str(python), str(REPO / "bench" / "sim_speed_flower.py"), "check", "--init", str(init), "--batch", str(batch),
         "--lr", str(LR), "--out", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    model = TFLiteModel(ensure_model(MODEL))
    start = model.get_weights()
    with np.load(batch, allow_pickle=False) as b:
        x, y = b["x"], b["y"]
    logits = model.predict_logits(x)
    stepped = model.train(x, y, epochs=1, batch_size=BATCH, lr=LR, seed=0, initial_weights=start).weights
    with np.load(out, allow_pickle=False) as t:
        torch_logits = t["logits"]
        torch_weights = np.concatenate([t[f"w{i}"].ravel() for i in range(len(t.files) - 1)])
    return float(np.abs(logits - torch_logits).max()), float(np.abs(stepped - torch_weights).max())


def flower_run(
    python: Path, data: Path, init: Path, tmp: Path, eval_every: int = 1
) -> tuple[float, float, dict[str, object]]:
    """(whole-process seconds, median seconds per round after the first, the run's JSON)."""
    out = tmp / "flower.json"
    cmd = [
        str(python), str(REPO / "bench" / "sim_speed_flower.py"), "run", "--data", str(data), "--init", str(init),
        "--rounds", str(ROUNDS), "--clients-per-round", str(CLIENTS_PER_ROUND), "--epochs", str(EPOCHS),
        "--batch", str(BATCH), "--lr", str(LR), "--json", str(out), "--eval-every", str(eval_every),
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"the Flower run failed:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    return wall, statistics.median(result["round_s"][1:]), result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each side (default 3)")
    p.add_argument("--with-flower", action="store_true", help="also run Flower (installs it into its own venv)")
    p.add_argument(
        "--eval-every",
        type=int,
        default=1,
        metavar="N",
        help="both sides score every writer every N rounds and after the last (default 1, the issue's task; "
        "0: never); figures other than N = 1 carry the suffix _evalN",
    )
    args = p.parse_args()
    if args.repeats < 1:
        sys.exit("--repeats must be at least 1")
    if args.eval_every < 0:
        sys.exit("--eval-every must be 0 or more")
    every, suffix = args.eval_every, "" if args.eval_every == 1 else f"_eval{args.eval_every}"
    with tempfile.TemporaryDirectory(prefix="covey-sim-speed-") as name:
        tmp = Path(name)
        python = flower_python() if args.with_flower else None
        warm, _ = covey_run(1, tmp / "warm")  # fills the parsed-data cache and the zoo
        print(f"covey warm-up run (fills the data cache when cold): {warm:.2f} s", flush=True)
        if python is not None:
            data, init, batch = export_for_flower(tmp)
            d_logits, d_weights = check_one_step(python, init, batch, tmp)
            ok = max(d_logits, d_weights) <= TOLERANCE
            print(
                f"check (one writer, {BATCH} samples, same initial weights): max |Δ logits| = {d_logits:.2e}, "
                f"max |Δ weights| after one SGD step = {d_weights:.2e}, tolerance {TOLERANCE:g}: "
                + ("the maths agree" if ok else "MISMATCH"),
                flush=True,
            )
        side: dict[str, list[tuple[float, float]]] = {"w1": [], "w2": [], "flower": []}
        info: dict[str, object] = {}
        for i in range(args.repeats):
            side["w1"].append(covey_run(1, tmp / f"w1_{i}", every))
            side["w2"].append(covey_run(2, tmp / f"w2_{i}", every))
            if python is not None:
                wall, per_round, info = flower_run(python, data, init, tmp, every)
                side["flower"].append((wall, per_round))
            shown = ", ".join(f"{k} {v[-1][0]:.2f} s ({v[-1][1] * 1000:.0f} ms/round)" for k, v in side.items() if v)
            print(f"run {i + 1}: {shown}", flush=True)
        med = {k: tuple(statistics.median(x) for x in zip(*v, strict=True)) for k, v in side.items() if v}
        print(f"figure sim_covey_wall_s{suffix} = {med['w1'][0]:.2f}")
        print(f"figure sim_covey_round_s{suffix} = {med['w1'][1]:.4f}")
        print(f"figure sim_workers2_speedup{suffix} = {med['w1'][1] / med['w2'][1]:.2f}")
        print(f"figure sim_workers2_wall_speedup{suffix} = {med['w1'][0] / med['w2'][0]:.2f}")
        if python is not None:
            final = info.get("accuracy") or [float("nan")]
            print(f"flower: {info.get('versions')}, final accuracy {final[-1]:.3f}")
            print(f"figure sim_flower_wall_s{suffix} = {med['flower'][0]:.2f}")
            print(f"figure sim_flower_round_s{suffix} = {med['flower'][1]:.4f}")
            print(f"figure sim_vs_flower_wall_ratio{suffix} = {med['w1'][0] / med['flower'][0]:.3f}")
            print(f"figure sim_vs_flower_round_ratio{suffix} = {med['w1'][1] / med['flower'][1]:.3f}")
            print(f"figure sim_vs_flower_wall_ratio_workers2{suffix} = {med['w2'][0] / med['flower'][0]:.3f}")
            print(f"figure sim_vs_flower_round_ratio_workers2{suffix} = {med['w2'][1] / med['flower'][1]:.3f}")


if __name__ == "__main__":
    main()
