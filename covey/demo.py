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


def run_demo(
    *,
    model_name: str,
    rounds: int,
    devices: int,
    out_dir: Path,
    data_dir: str | None,
    broker: str | None,
) -> int:
    from covey.paths import ensure_model, femnist_dir
    from server.broker import start_embedded
    from server.fleet import leaf_writers, start_fleet
    from server.serve import ServeOptions, serve

    start = time.perf_counter()
    root = Path(data_dir) if data_dir else femnist_dir()
    print(f"building or loading the {model_name} model ...", flush=True)
    model_path = ensure_model(model_name)
    handle = None
    if broker:
        host, _, port_text = broker.rpartition(":")
        if not host or not port_text.isdigit():
            raise ConfigError(f"--broker must be HOST:PORT, got {broker!r}")
        port = int(port_text)
    else:
        handle = start_embedded()
        host, port = handle.host, handle.port
        print(f"embedded MQTT broker (amqtt) on {host}:{port}", flush=True)
    run = f"demo{int(time.time()) % 100000}"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        writers = leaf_writers(root, devices)
        with start_fleet(
            root, writers, run=run, host=host, port=port, log_dir=out_dir / "device-logs", idle_timeout=300
        ):
            print(f"{devices} device agents started (one FEMNIST writer each), run {run}", flush=True)
            coord = serve(
                ServeOptions(
                    run=run,
                    host=host,
                    port=port,
                    strategy="fedgsp",
                    strategy_params={"growth": "log", "alpha": 1.0, "beta": 2, "kappa": 1.0},
                    model_path=model_path,
                    rounds=rounds,
                    min_devices=devices,
                    state_dir=out_dir,
                    eval_dir=root,
                    handoff="auto",
                    deadline_s=60.0,
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
