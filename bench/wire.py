"""Bytes on the wire and accuracy per codec: fp32 against fp16, int8 and int4 deltas.

The ``fedgsp-femnist`` preset (the bundled FEMNIST sample, 51 writers) with
``--models`` (MLP and/or CNN) and FedAvg and FedGSP, each run with ``--codec`` fp32,
fp16, int8 and int4 (``--codecs``) for every seed of ``--seeds``, in simulation.
Bytes are the frames the simulator builds for every model it moves
(``server/simulation/virtual_bus.py``: start models to each member, outputs and chain
hand-offs), summed over the run. Prints, per codec and strategy (and model, when more
than one), means over the seeds of per-seed figures:

* ``wire_bytes_ratio_<codec>_<strategy>``: fp32 bytes / codec bytes (higher is better),
  each frame counted once as sent (a server's start model once per device that gets it);
* ``wire_down_bytes_ratio_…`` / ``wire_up_bytes_ratio_…``: the same for server-to-device
  frames / device-to-anyone frames only;
* ``wire_radio_bytes_ratio_…``: the same for what the devices' own links carry, where a
  hand-off from device to device crosses the sender's link and the receiver's (an int8
  chain's relayed hand-off crosses them once each too, through the coordinator);
* ``wire_acc_delta_pts_<codec>_<strategy>``: final accuracy, codec minus fp32, in points
  (``wire_acc_delta_sd_pts_…``: its standard deviation over the seeds).

Usage: ``python bench/wire.py [--models mlp_femnist cnn_femnist] [--rounds 30] [--seeds 0 1 2]
[--codecs fp16 int8 int4]``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from server.settings import Source  # noqa: E402
from server.simulation.config import SimulationConfig  # noqa: E402
from server.simulation.presets import PRESETS  # noqa: E402
from server.simulation.run import RunResult, run_simulation  # noqa: E402

CODECS = ("fp32", "fp16", "int8", "int4")


def figure(name: str, value: float) -> None:
    print(f"figure {name} = {value:.3f}", flush=True)


def _run(model: str, strategy: str, codec: str, seed: int, args: argparse.Namespace) -> RunResult:
    cfg = PRESETS["fedgsp-femnist"].apply(SimulationConfig(), strategy)
    cfg = cfg.with_overrides(
        Source.FLAG, "bench/wire.py", model=model, rounds=args.rounds, seed=seed, workers=args.workers, codec=codec
    )
    result = run_simulation(cfg)
    s = result.summary
    print(
        f"# {model} {strategy} {codec} seed {seed}: final {result.final_accuracy:.2%}, "
        f"{s['wire_bytes'] / 1e6:.1f} MB on the wire "
        f"({s['wire_bytes_per_round'] / 1e6:.2f} MB per round), {result.seconds:.0f} s",
        flush=True,
    )
    return result


def _bytes(result: RunResult, key: str) -> float:
    return sum(r.extra[key] for r in result.records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp_femnist"], choices=["mlp_femnist", "cnn_femnist"])
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "fedgsp"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--codecs", nargs="+", default=list(CODECS[1:]), choices=CODECS[1:], help="codecs to compare with fp32"
    )
    args = parser.parse_args()
    for model in args.models:
        suffix = "" if len(args.models) == 1 else f"_{model.split('_')[0]}"
        for strategy in args.strategies:
            codecs = ["fp32", *args.codecs]
            runs = [{codec: _run(model, strategy, codec, seed, args) for codec in codecs} for seed in args.seeds]
            for codec in args.codecs:
                name = f"{codec}_{strategy}{suffix}"
                ratio = [_bytes(r["fp32"], "wire_bytes") / _bytes(r[codec], "wire_bytes") for r in runs]
                down = [_bytes(r["fp32"], "wire_bytes_down") / _bytes(r[codec], "wire_bytes_down") for r in runs]
                up = [_bytes(r["fp32"], "wire_bytes_up") / _bytes(r[codec], "wire_bytes_up") for r in runs]
                radio = [_bytes(r["fp32"], "wire_radio_bytes") / _bytes(r[codec], "wire_radio_bytes") for r in runs]
                acc = [(r[codec].final_accuracy - r["fp32"].final_accuracy) * 100 for r in runs]
                print(f"# {name}: accuracy delta per seed {', '.join(f'{a:+.2f}' for a in acc)}", flush=True)
                figure(f"wire_bytes_ratio_{name}", float(np.mean(ratio)))
                figure(f"wire_down_bytes_ratio_{name}", float(np.mean(down)))
                figure(f"wire_up_bytes_ratio_{name}", float(np.mean(up)))
                figure(f"wire_radio_bytes_ratio_{name}", float(np.mean(radio)))
                figure(f"wire_acc_delta_pts_{name}", float(np.mean(acc)))
                figure(f"wire_acc_delta_sd_pts_{name}", float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0)


if __name__ == "__main__":
    main()
