"""Poisoning in simulation: one device boosts its update x100; what screening saves.

Each strategy runs ``--rounds`` rounds over the first ``--devices`` FEMNIST writers
(named dev000, ...: the writers and names of the MQTT poisoning test) with the same
seed, five ways: clean; poisoned with screening off; poisoned with the update-norm
bound (the default, ``norm_factor`` 10); poisoned with the coordinate-wise median
and with the trimmed mean instead of the norm bound. dev000 is the poisoner. Scored
with the global model on the pooled FEMNIST test set (server-side accuracy).

Prints per strategy and condition the final accuracy, and

``figure poison_<strategy>_<condition>_acc_delta_pts = ...`` (final accuracy minus
the clean run's, in points; ``clean_median`` and ``clean_trimmed``: no poisoner, the
robust rules' own cost), and over every clean run
``figure screening_clean_max_ratio = ...`` (the largest update norm over its round's
median: how close honest updates come to the bound) and
``figure screening_clean_rejections = ...`` (honest updates refused).

``--mqtt`` instead runs FedAvg over a mosquitto started here with ``--devices`` agent
processes, dev000 being ``tests/mqtt/poisoning_agent.py``: clean, screened and
unscreened, and prints ``figure poison_mqtt_fedavg_<norm|off>_acc_delta_pts = ...``.

``--survey`` instead runs clean simulations on Synthetic(1,1) (30 clients of 45 to 800
samples, 20 local epochs: the most uneven updates of the paper settings) and MNIST
(Dirichlet 0.3) and prints ``figure screening_clean_max_ratio_survey = ...``.

Usage: ``python bench/poisoning.py [--rounds 20] [--devices 8] [--scale 100] [--mqtt | --survey]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from server.screening import ScreeningConfig  # noqa: E402
from server.strategies import make_strategy  # noqa: E402
from server.strategies.base import TrainConfig  # noqa: E402

TRAIN = TrainConfig(epochs=3, batch_size=10, lr=0.003)  # smooth: one writer less moves little
CONDITIONS = {
    "clean": (False, ScreeningConfig()),
    "clean_median": (False, ScreeningConfig(norm_factor=None, aggregation="median")),
    "clean_trimmed": (False, ScreeningConfig(norm_factor=None, aggregation="trimmed_mean", trim=0.2)),
    "off": (True, None),
    "norm": (True, ScreeningConfig()),
    "median": (True, ScreeningConfig(norm_factor=None, aggregation="median")),
    "trimmed": (True, ScreeningConfig(norm_factor=None, aggregation="trimmed_mean", trim=0.2)),
}


def strategies(devices: int) -> dict[str, object]:
    return {
        "fedavg": lambda: make_strategy("fedavg", train=TRAIN, clients_per_round=devices),
        "fedprox": lambda: make_strategy("fedprox", train=TRAIN, clients_per_round=devices, mu=0.01),
        "fedgsp": lambda: make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=0.0, beta=4, kappa=1.0),
        "ifca": lambda: make_strategy("ifca", train=TRAIN, n_groups=2, clients_per_round=devices),
    }


def on_mqtt(args: argparse.Namespace) -> int:
    """Clean, screened and unscreened FedAvg over MQTT with one poisoning agent."""
    import tempfile

    from covey.paths import ensure_model, femnist_dir
    from device.data import Dataset, read_leaf
    from server.broker import start_mosquitto
    from server.lab.poisoning import on_boards

    root = femnist_dir()
    test = read_leaf(root / "test")
    held_out = Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))
    script = REPO / "tests" / "mqtt" / "poisoning_agent.py"
    n = args.devices

    def make():  # type: ignore[no-untyped-def]
        return make_strategy("fedavg", train=TRAIN, clients_per_round=n)

    finals = {}
    with start_mosquitto() as broker, tempfile.TemporaryDirectory() as work:
        for condition, poisoner, screening in (
            ("clean", None, ScreeningConfig()),
            ("norm", script, ScreeningConfig()),
            ("off", script, None),
        ):
            start = time.perf_counter()
            out = on_boards(
                make,
                root=root,
                model_path=ensure_model(args.model),
                eval_data=held_out,
                rounds=args.rounds,
                n_devices=n,
                seed=args.seed,
                screening=screening,
                poisoner_script=poisoner,
                scale=args.scale,
                host=broker.host,
                port=broker.port,
                work=Path(work) / condition,
                run=f"bench-poison-{condition}",
            )
            finals[condition] = out.final_accuracy
            refused = sum(out.rejected.values())
            print(
                f"fedavg over MQTT, {condition:<6} final server accuracy {100 * out.final_accuracy:5.1f} %, "
                f"{refused} updates refused, {time.perf_counter() - start:.0f} s",
                flush=True,
            )
    for condition in ("norm", "off"):
        print(
            f"figure poison_mqtt_fedavg_{condition}_acc_delta_pts = {100 * (finals[condition] - finals['clean']):.2f}"
        )
    return 0


def survey(rounds: int) -> int:
    """Clean runs with uneven clients: the largest update over its round's median."""
    from covey.paths import ensure_model
    from server.simulation.datasets import mnist, synthetic
    from server.simulation.engine import Simulation

    never = ScreeningConfig(norm_factor=1e9)  # measures, never refuses
    paper = TrainConfig(20, 10, 0.01)
    cases = [
        ("fedavg", "synthetic", {"clients_per_round": 10}, paper),
        ("fedprox", "synthetic", {"clients_per_round": 10, "mu": 1.0}, paper),
        ("fedgroup", "synthetic", {"n_groups": 3, "clients_per_round": 10, "alpha": 3, "pretrain_steps": 10}, paper),
        ("fedgsp", "synthetic", {"beta": 5, "kappa": 1.0, "growth": "linear", "alpha": 0.0}, TrainConfig(1, 5, 0.01)),
        ("fedavg", "mnist", {"clients_per_round": 10}, TrainConfig(1, 10, 0.05)),
    ]
    worst = 0.0
    for name, data, params, train in cases:
        fed = (
            synthetic(1, 1, 30, seed=0) if data == "synthetic" else mnist(30, "dirichlet", seed=0, dirichlet_alpha=0.3)
        )
        model = ensure_model("mclr_synthetic" if data == "synthetic" else "mclr_mnist")
        sim = Simulation(
            make_strategy(name, train=train, **params), fed, model, seed=0, federated_eval_every=0, screening=never
        )
        ratios = [r.extra["update_norm_max_ratio"] for r in sim.run(rounds) if "update_norm_max_ratio" in r.extra]
        print(f"{name:<8} {data:<9} largest update / round median: {max(ratios):.2f}", flush=True)
        worst = max(worst, *ratios)
    print(f"figure screening_clean_max_ratio_survey = {worst:.2f}")
    return 0


def main() -> int:
    from covey.paths import ensure_model, femnist_dir
    from device.data import Dataset, read_leaf
    from server.fleet import leaf_writers
    from server.simulation.datasets import ClientData
    from server.simulation.engine import Simulation
    from server.simulation.faults import Faults
    from server.simulation.trainer import server_evaluator

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--scale", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--model", default="mlp_femnist")
    p.add_argument("--strategies", default="fedavg,fedprox,fedgsp,ifca")
    p.add_argument("--survey", action="store_true", help="the clean norm-ratio survey instead")
    p.add_argument("--mqtt", action="store_true", help="FedAvg over mosquitto with agent processes instead")
    args = p.parse_args()
    if args.survey:
        return survey(args.rounds)
    if args.mqtt:
        return on_mqtt(args)

    root = femnist_dir()
    model = ensure_model(args.model)
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    writers = leaf_writers(root, args.devices)
    ids = [f"dev{i:03d}" for i in range(args.devices)]
    held_out = Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))
    evaluate = server_evaluator(model, held_out)
    ratios, honest_rejections = [], 0
    for name in args.strategies.split(","):
        make = strategies(args.devices)[name]
        finals = {}
        for condition, (poisoned, screening) in CONDITIONS.items():
            fed = {d: ClientData(train[w], test[w]) for d, w in zip(ids, writers, strict=True)}
            faults = Faults(scale={"dev000": args.scale}) if poisoned else None
            start = time.perf_counter()
            sim = Simulation(
                make(),  # type: ignore[operator]
                fed,
                model,
                seed=args.seed,
                federated_eval_every=0,
                faults=faults,
                screening=screening,
                server_eval=evaluate,
            )
            records = sim.run(args.rounds)
            finals[condition] = records[-1].server_accuracy
            rejected = sum(sum(r.rejected.values()) for r in records)
            if condition == "clean":
                ratios += [r.extra["update_norm_max_ratio"] for r in records if "update_norm_max_ratio" in r.extra]
                honest_rejections += rejected
            print(
                f"{name:<8} {condition:<8} final server accuracy {100 * finals[condition]:5.1f} %, "
                f"{rejected} updates refused, {time.perf_counter() - start:.0f} s",
                flush=True,
            )
        for condition in CONDITIONS:
            if condition != "clean":
                delta = 100 * (finals[condition] - finals["clean"])
                print(f"figure poison_{name}_{condition}_acc_delta_pts = {delta:.2f}")
    print(f"figure screening_clean_max_ratio = {max(ratios):.2f}")
    print(f"figure screening_clean_rejections = {honest_rejections}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
