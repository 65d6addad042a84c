"""``covey demo``: a whole covey site on one machine.

An embedded amqtt broker (or ``--broker HOST:PORT``), the coordinator, and 8 device
agents as separate processes, each holding one FEMNIST writer's data from the bundled
LEAF sample, run FedGSP for 10 rounds over MQTT. Progress bars show registration and
rounds; the demo ends with the server-side accuracy and a plot.
"""

from __future__ import annotations

import time
from pathlib import Path

from device.errors import ConfigError


def check_demo_options(
    *, rounds: int, devices: int, out_dir: Path, data_dir: str | None, broker: str | None
) -> tuple[Path, list[str], tuple[str, int] | None]:
    """Every demo setting, before a broker, an agent or an output file exists.

    Returns the LEAF folder, the writers the agents will hold (the first ``devices``
    of its train split, in file order) and the broker address if one was given.
    """
    from covey.paths import femnist_dir
    from device.cli import parse_broker
    from device.data import read_leaf

    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    address = parse_broker(broker) if broker else None
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; give a folder for the plot, metrics and device logs")
    if data_dir:
        root = Path(data_dir)
        if not (root / "train").is_dir() or not (root / "test").is_dir():
            raise ConfigError(f"--data-dir {root} needs train/ and test/ folders of LEAF JSON")
    else:
        root = femnist_dir()
    writers = list(read_leaf(root / "train"))
    if not 1 <= devices <= len(writers):
        raise ConfigError(
            f"--devices must be 1 to {len(writers)} (one agent per writer; {root / 'train'} has "
            f"{len(writers)} writers), got {devices}"
        )
    chosen = writers[:devices]
    test_writers = set(read_leaf(root / "test"))
    missing = [w for w in chosen if w not in test_writers]
    if missing:
        raise ConfigError(
            f"writer {missing[0]!r} of {root / 'train'} has no test data in {root / 'test'}; "
            "every agent's writer needs both"
        )
    return root, chosen, address


def run_demo(
    *,
    model_name: str,
    rounds: int,
    devices: int,
    out_dir: Path,
    data_dir: str | None,
    broker: str | None,
) -> int:
    from covey.paths import ensure_model
    from server.broker import start_embedded
    from server.coordinator.config import CoordinatorConfig
    from server.fleet import start_fleet
    from server.run_config import RunConfig
    from server.serve import ServeOptions, serve

    start = time.perf_counter()
    root, writers, address = check_demo_options(
        rounds=rounds, devices=devices, out_dir=out_dir, data_dir=data_dir, broker=broker
    )
    print(f"building or loading the {model_name} model ...", flush=True)
    model_path = ensure_model(model_name)
    handle = None
    if address is not None:
        host, port = address
    else:
        handle = start_embedded()
        host, port = handle.host, handle.port
        print(f"embedded MQTT broker (amqtt) on {host}:{port}", flush=True)
    run = f"demo{int(time.time()) % 100000}"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with start_fleet(
            root, writers, run=run, host=host, port=port, log_dir=out_dir / "device-logs", idle_timeout=300
        ):
            print(f"{devices} device agents started (one FEMNIST writer each), run {run}", flush=True)
            coord = serve(
                ServeOptions(
                    CoordinatorConfig(run, host, port, out_dir, handoff="auto", deadline_s=60.0),
                    RunConfig(
                        strategy="fedgsp",
                        strategy_params={"growth": "log", "alpha": 1.0, "beta": 2, "kappa": 1.0},
                        rounds=rounds,
                        federated_eval_every=0,  # the demo reports the server's held-out accuracy
                    ),
                    model_path=model_path,
                    min_devices=devices,
                    eval_dir=root,
                    register_timeout=120.0,
                )
            )
    finally:
        if handle is not None:
            handle.stop()
    first, last = coord.records[0], coord.records[-1]
    print(
        f"FedGSP over MQTT: {rounds} rounds, {devices} devices, server-side test accuracy "
        f"{first.server_accuracy:.1%} -> {last.server_accuracy:.1%} in {time.perf_counter() - start:.0f} s"
    )
    print(f"plot {out_dir / 'results.png'}, results {out_dir / 'results.csv'}, device logs {out_dir / 'device-logs'}")
    return 0
