"""Model transport over MQTT, in one run on one mosquitto.

1. Throughput: moving the weights of the MCLR-62 (0.2 MB), the MLP 784-512-62
   (1.7 MB) and the FEMNIST CNN (26 MB) from a device to its successor through covey
   (encode frames, publish, receive, reassemble, check sha256/shape/finite, decode),
   against paho publishing and receiving the same bytes raw. Median over repeats.
   ``figure transport_ratio_<size>mb = covey throughput / raw throughput``.
2. Round overhead: ``--agents`` agent processes train the FEMNIST CNN one epoch on
   their writers' data in one FedAvg round; the share of the round spent outside
   training, ``(round wall time - slowest device's training time) / round wall time``.
   ``figure round_overhead_pct``.

Usage: ``python bench/transport.py [--repeats 5] [--agents 50] [--skip-round]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SIZES = {"0.2": 48_670, "1.7": 433_726, "26": 6_603_710}


def _receiver(mode: str, host: str, port: int, n: int, n_params: int, queue) -> None:  # type: ignore[no-untyped-def]
    """The successor device: its own process, as on a board."""
    if mode == "raw":
        import paho.mqtt.client as paho

        count = [0]
        done = threading.Event()

        def on_message(client, userdata, msg) -> None:  # type: ignore[no-untyped-def]
            count[0] += 1
            if count[0] == n:
                done.set()

        rx = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"raw-rx-{os.getpid()}")
        rx.on_message = on_message
        rx.connect(host, port)
        rx.loop_start()
        rx.subscribe("bench/raw", qos=1)
        time.sleep(0.3)
        queue.put("ready")
        done.wait(300)
        queue.put(time.monotonic())
        rx.disconnect()
        rx.loop_stop()
        return
    from device.mqtt import MqttLink
    from device.protocol import Reassembler, Topics, check_weights

    topics = Topics("bench")
    link = MqttLink(f"covey-rx-{os.getpid()}", host, port, clean_session=True)
    link.connect(10)
    link.subscribe(topics.handoff("succ", "pred"))
    time.sleep(0.3)
    queue.put("ready")
    reassembler = Reassembler()
    received = 0
    while received < n:
        item = link.receive(60)
        if item is None:
            break
        payload = reassembler.add(item.payload)
        if payload is not None:
            check_weights(payload, n_params)  # sha256, shape, dtype, finite
            received += 1
    queue.put(time.monotonic())
    link.close()


def _transfer(mode: str, host: str, port: int, weights: np.ndarray, n: int) -> float:
    """Seconds from the first publish to the last checked receipt in the other process."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(mode, host, port, n, weights.size, queue))
    proc.start()
    if queue.get(timeout=60) != "ready":
        raise RuntimeError("receiver did not start")
    if mode == "raw":
        import paho.mqtt.client as paho

        tx = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="raw-tx")
        tx.connect(host, port)
        tx.loop_start()
        payload = weights.tobytes()
        start = time.monotonic()
        for _ in range(n):
            tx.publish("bench/raw", payload, qos=1)
        end = queue.get(timeout=300)
        tx.disconnect()
        tx.loop_stop()
    else:
        from device.mqtt import MqttLink
        from device.protocol import FrameExtra, Topics, encode_frames

        topics = Topics("bench")
        link = MqttLink("covey-tx", host, port, clean_session=True)
        link.connect(10)
        start = time.monotonic()
        for i in range(n):
            for frame in encode_frames(
                weights,
                kind="handoff",
                run="bench",
                round=1,
                group=0,
                sender="pred",
                extra=FrameExtra(f"t{i}", position=0),
            ):
                link.publish(topics.handoff("succ", "pred"), frame)
        end = queue.get(timeout=300)
        link.close()
    proc.join(timeout=30)
    return float(end) - start


def throughput(host: str, port: int, repeats: int) -> None:
    for label, n_params in SIZES.items():
        weights = np.random.default_rng(0).normal(size=n_params).astype(np.float32)
        n = max(2, int(60e6 / weights.nbytes))  # about 60 MB per measurement
        raw_t, covey_t = [], []
        for _ in range(repeats):
            raw_t.append(_transfer("raw", host, port, weights, n))
            covey_t.append(_transfer("covey", host, port, weights, n))
        ratio = statistics.median(raw_t) / statistics.median(covey_t)
        mb_s = n * weights.nbytes / statistics.median(covey_t) / 1e6
        print(
            f"# {label} MB x {n}: raw {statistics.median(raw_t):.3f} s, covey {statistics.median(covey_t):.3f} s "
            f"({mb_s:.0f} MB/s)",
            flush=True,
        )
        print(f"figure transport_ratio_{label}mb = {ratio:.3f}", flush=True)


def round_overhead(host: str, port: int, n_agents: int, log_dir: Path | None) -> None:
    from covey.paths import ensure_model, femnist_dir
    from device.data import read_leaf
    from device.protocol import Message, TrainResult
    from server.coordinator.config import CoordinatorConfig
    from server.coordinator.coordinator import Coordinator
    from server.fleet import start_fleet
    from server.strategies import make_strategy
    from server.strategies.base import TrainConfig

    root = femnist_dir()
    writers = list(read_leaf(root / "train"))
    writers = (writers * (n_agents // len(writers) + 1))[:n_agents]
    model = ensure_model("cnn_femnist")
    run = "overhead"
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_fleet(root, writers, run=run, host=host, port=port, log_dir=log_dir or Path(tmp) / "logs"),
    ):
        strategy = make_strategy(
            "fedavg", train=TrainConfig(epochs=1, batch_size=5, lr=0.01), clients_per_round=n_agents
        )
        coord = Coordinator(CoordinatorConfig(run, host, port, Path(tmp) / "state", deadline_s=900), strategy, model)
        train_seconds: list[float] = []
        finished_at: list[float] = []  # device clock = this machine's clock
        original = coord.inbox._on_result

        def spy(device: str, msg: Message) -> None:
            if isinstance(msg.body, TrainResult):  # a typed body, as the coordinator receives it
                train_seconds.append(msg.body.train_seconds)
                finished_at.append(msg.sent_at - msg.body.deliver_seconds)
            original(device, msg)

        coord.inbox._on_result = spy  # type: ignore[method-assign]
        started: list[float] = []
        [metrics] = coord.run_rounds(n_agents, 1, register_timeout=900, on_ready=lambda: started.append(time.time()))
        round_start = started[0]
    slowest = max(train_seconds)
    starts = [end - secs - round_start for end, secs in zip(finished_at, train_seconds, strict=True)]
    ends = [end - round_start for end in finished_at]
    print(
        f"# training started {min(starts):.1f}-{max(starts):.1f} s into the round, "
        f"ended {min(ends):.1f}-{max(ends):.1f} s; round over at {metrics.wall_s:.1f} s",
        flush=True,
    )
    overhead = 100 * (metrics.wall_s - slowest) / metrics.wall_s
    print(
        f"# {n_agents} agents: round {metrics.wall_s:.1f} s, slowest training {slowest:.1f} s, "
        f"{metrics.trained} trained",
        flush=True,
    )
    print(f"figure round_overhead_pct = {overhead:.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--log-dir", type=Path, help="keep the agents' logs here")
    parser.add_argument("--skip-round", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    from server.broker import start_mosquitto

    with start_mosquitto() as broker:
        if not args.skip_throughput:
            throughput(broker.host, broker.port, args.repeats)
        if not args.skip_round:
            round_overhead(broker.host, broker.port, args.agents, args.log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
