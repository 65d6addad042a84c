"""Simulation against boards: the same strategy, seed and writers, both ways.

Each strategy runs ``--rounds`` rounds over ``--devices`` FEMNIST writers twice: as
virtual devices in the simulator and as ``covey-device`` processes over a mosquitto
started here (FedGSP once with direct and once with relayed hand-offs). Prints, per
strategy, the largest absolute difference between the two runs' final models (the
global model and every group model the strategy keeps) and between their per-round
federated accuracies:

``figure sim_mqtt_max_abs_diff_<strategy> = ...``
``figure sim_mqtt_acc_diff_<strategy> = ...``

With ``--boards loopback``, the boards are the same coordinator and agent code in this
process over the loopback broker (``server/loopback.py``), and the figures are
``sim_loopback_max_abs_diff_<strategy>`` and ``sim_loopback_acc_diff_<strategy>``,
with each case's wall time beside them, ``sim_loopback_s_<strategy>``.

Usage: ``python bench/equivalence.py [--rounds 5] [--devices 8] [--model mlp_femnist] [--boards mosquitto|loopback]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from server.strategies import make_strategy  # noqa: E402
from server.strategies.base import TrainConfig  # noqa: E402

TRAIN = TrainConfig(epochs=1, batch_size=5, lr=0.01)


def cases(devices: int) -> dict[str, tuple[str, object]]:
    gsp = {"growth": "linear", "alpha": 1.0, "beta": 2, "kappa": 1.0}
    return {
        "fedavg": ("direct", lambda: make_strategy("fedavg", train=TRAIN, clients_per_round=devices // 2)),
        "fedgsp_direct": ("direct", lambda: make_strategy("fedgsp", train=TRAIN, **gsp)),
        "fedgsp_relay": ("relay", lambda: make_strategy("fedgsp", train=TRAIN, **gsp)),
        "ifca": ("direct", lambda: make_strategy("ifca", train=TRAIN, n_groups=2, clients_per_round=devices // 2)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--model", default="mlp_femnist")
    parser.add_argument("--boards", choices=("mosquitto", "loopback"), default="mosquitto")
    args = parser.parse_args()

    import contextlib

    from server.broker import start_mosquitto
    from server.lab.equivalence import run_both
    from server.paths import ensure_model, femnist_dir

    model = ensure_model(args.model)
    loopback = args.boards == "loopback"
    tag = "sim_loopback" if loopback else "sim_mqtt"
    with contextlib.nullcontext() if loopback else start_mosquitto() as broker, tempfile.TemporaryDirectory() as tmp:
        for name, (handoff, make) in cases(args.devices).items():
            start = time.perf_counter()
            result = run_both(
                make,  # type: ignore[arg-type]
                root=femnist_dir(),
                model_path=model,
                host=broker.host if broker is not None else "loopback",
                port=broker.port if broker is not None else 0,
                work=Path(tmp) / name,
                run=f"bench-eq-{name.replace('_', '')}",
                rounds=args.rounds,
                n_devices=args.devices,
                handoff=handoff,
                boards="loopback" if loopback else "mqtt",
            )
            seconds = time.perf_counter() - start
            accs = ", ".join(f"{r.federated_accuracy:.4f}" for r in result.mqtt)
            print(
                f"# {name}: {result.rounds} rounds, federated accuracy per round {accs} ({seconds:.0f} s)",
                flush=True,
            )
            print(f"figure {tag}_max_abs_diff_{name} = {result.max_abs_diff:.3g}", flush=True)
            print(f"figure {tag}_acc_diff_{name} = {result.accuracy_diff:.3g}", flush=True)
            if loopback:
                print(f"figure {tag}_s_{name} = {seconds:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
