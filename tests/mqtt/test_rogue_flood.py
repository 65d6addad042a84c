"""A rogue client floods every topic a device may write while the coordinator runs
rounds with agent processes: the run finishes, every message is dropped and counted,
and the coordinator's memory stays within its bound.

Probe (issue 12): 4,000 partial frames announcing 4 bytes but carrying 100 KB each
grew the coordinator from 220 to 612 MB, never freed. The protocol now checks every
chunk's length against its header, partial uploads are held only for registered
devices (two models' worth each), and the receive queue is bounded in bytes."""

from __future__ import annotations

import json
import struct
import threading
import time

import numpy as np
import psutil
import pytest

from device.errors import CoveyError
from device.mqtt import MqttLink
from device.protocol import MAGIC, FrameExtra, Topics, decode_message, encode_frames, parse_frame
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.lab.fuzzing.mutate import mutate_bytes
from server.lab.fuzzing.targets import all_targets
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
REAL = [f"dev{i:03d}" for i in range(4)]
MODEL_MB = 433_726 * 4 / 2**20
QUEUE_MB = 128
# the coordinator's own bound (server/coordinator/coordinator.py): the receive queue,
# two models' worth of partial uploads per registered device; plus room for the
# allocator and the round's own work (aggregation, evaluation)
BOUND_MB = QUEUE_MB + 2 * MODEL_MB * len(REAL) + 96


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


class PeakMemory:
    """Samples this process's RSS every 50 ms until stopped."""

    def __init__(self) -> None:
        self.peak = _rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _rss_mb())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss_mb())


def _refused(data: bytes, decode) -> bool:  # type: ignore[no-untyped-def]
    try:
        decode(data)
    except CoveyError:
        return True
    return False


def _malformed(kind: str, n: int, rng: np.random.Generator) -> list[bytes]:
    """``n`` mutated encodings that the decoder of ``kind`` refuses."""
    target = next(t for t in all_targets() if t.name == kind)
    decode = decode_message if kind == "message" else parse_frame
    out: list[bytes] = []
    while len(out) < n:
        parent = target.seeds[int(rng.integers(len(target.seeds)))]
        data = target.structured(parent, rng) if rng.random() < 0.5 else mutate_bytes(parent, rng, target.seeds)
        if len(data) <= 200_000 and _refused(data, decode):
            out.append(data)
    return out


def _short_frame(sender: str, carried: int) -> bytes:
    """A frame whose header announces 4 bytes, carrying ``carried`` bytes."""
    (frame,) = encode_frames(
        np.zeros(1, np.float32),
        kind="result",
        run="x",
        round=1,
        group=0,
        sender=sender,
        extra=FrameExtra("t", position=0),
    )
    (n,) = struct.unpack("<I", frame[4:8])
    header = json.loads(frame[8 : 8 + n])
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + bytes(carried)


def _honest_partials(sender: str, count: int) -> list[bytes]:
    """First chunks of ``count`` model-sized payloads that never complete."""
    out = []
    for i in range(count):
        frames = encode_frames(
            np.full(433_726, i, np.float32),
            kind="result",
            run="x",
            round=1,
            group=0,
            sender=sender,
            max_chunk=100_000,
            extra=FrameExtra("t", position=0),
        )
        out.append(next(iter(frames)))
    return out


def _traffic(run: str, rng: np.random.Generator) -> tuple[list[tuple[str, bytes]], int, dict[str, int]]:
    """(topic, payload) of the flood; how many go to the coordinator; how many to each agent."""
    t = Topics(run)
    ids = [*REAL, "ghost1", "ghost2"]  # registered devices and ids nobody registered
    messages = _malformed("message", 2000, rng)
    frames = _malformed("frame", 1200, rng)
    out: list[tuple[str, bytes]] = []
    for i, payload in enumerate(messages):
        kind = "register" if i % 2 else "results"
        out.append((t.from_device(ids[i % len(ids)], kind), payload))  # type: ignore[arg-type]
    for i, payload in enumerate(frames[:600]):
        out.append((t.uploads(ids[i % len(ids)]), payload))
    for i in range(300):
        out.append((t.status(ids[i % len(ids)]), bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8))))
    to_server = len(out)
    to_agents: dict[str, int] = {}
    for i, payload in enumerate(frames[600:]):
        device = REAL[i % len(REAL)]
        out.append((t.handoff(device, "rogue"), payload))
        to_agents[device] = to_agents.get(device, 0) + 1
    order = rng.permutation(len(out))
    return [out[i] for i in order], to_server, to_agents


def _publish_all(broker, traffic: list[tuple[str, bytes]]) -> threading.Thread:  # type: ignore[no-untyped-def]
    rogue = MqttLink("rogue-flood", broker.host, broker.port, clean_session=True)
    rogue.connect(10)

    def run() -> None:
        for topic, payload in traffic:
            rogue.publish(topic, payload, wait=30)
        rogue.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _coordinator(broker, femnist_eval, tmp_path, run: str) -> Coordinator:  # type: ignore[no-untyped-def]
    from covey.paths import ensure_model

    return Coordinator(
        CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", deadline_s=60.0, max_queue_mb=QUEUE_MB),
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.01), clients_per_round=4),
        ensure_model("mlp_femnist"),
        femnist_eval,
    )


def _drain(coord: Coordinator, expected: int, records: list, timeout: float = 120, held=lambda: 0) -> int:  # type: ignore[no-untyped-def, type-arg]
    """Pump until ``expected`` messages were counted as drops (in records and since the
    last one) or are ``held`` as partial uploads; returns the drops."""
    deadline = time.monotonic() + timeout
    drops = coord.bus.drops  # this round's counts so far (the records hold earlier rounds')
    while (n := sum(sum(r.dropped.values()) for r in records) + sum(drops.by_reason.values())) + held() < expected:
        assert time.monotonic() < deadline, f"only {n} of {expected} rogue messages counted"
        coord.pump(0.2)
    return n


def test_partial_frames_that_carry_more_than_they_announce_do_not_grow_the_coordinator(
    broker, femnist_eval, tmp_path
) -> None:
    # Prepare
    run, root = "flood-partials", femnist_root()
    # The flood writes in the training devices' names (this broker has no ACLs: a site's
    # would refuse it). A device's own chunked upload shares its two-models bound with
    # those partials and could be evicted by them, one more drop than the flood sent;
    # so the agents send each model in one frame, and only the flood's partials are held.
    whole = ["--max-chunk", str(2 * 433_726 * 4)]
    with start_fleet(
        root,
        leaf_writers(root, 4),
        run=run,
        host=broker.host,
        port=broker.port,
        log_dir=tmp_path / "logs",
        agent_args=whole,
    ):
        coord = _coordinator(broker, femnist_eval, tmp_path, run)
        coord.connect()
        coord.wait_for_devices(4, timeout=120)
        coord.setup_strategy()
        records = [coord.step()]
        t = Topics(run)
        # the probe: 4,000 frames announcing 4 bytes and carrying 100 KB, in a registered
        # device's name; then 2,000 honest-looking first chunks that never complete (the
        # test holds one copy of each payload: its own memory must not blur the measure)
        short = _short_frame("dev000", 100_000)
        traffic = [(t.uploads("dev000"), short)] * 4000
        traffic += [(t.uploads(REAL[i % 4]), f) for i, f in enumerate(_honest_partials("dev001", 50) * 40)]
        baseline = _rss_mb()
        memory = PeakMemory()

        # Execute: the flood while rounds go on
        rogue = _publish_all(broker, traffic)
        while rogue.is_alive() or len(records) < 3:
            records.append(coord.step())
        held = lambda: len(coord.bus._frames._parts)  # noqa: E731
        counted = _drain(coord, len(traffic), records, held=held)
        held_now = held()
        records.append(coord.step())
        peak = memory.stop()
        timed = [path for path in coord.prober.book.transfers if path[0] in REAL]
        coord.stop_devices()
        coord.close()

    # Assert
    reasons = {k for r in records for k in r.dropped}
    assert not timed  # every upload came in one frame (--max-chunk), never held as a partial
    print(f"coordinator RSS {baseline:.0f} MB before the flood, peak {peak:.0f} MB (bound +{BOUND_MB:.0f} MB)")
    assert counted + held_now == len(traffic)  # held: the newest partials, within the per-device bound
    assert held_now <= 2 * len(REAL)
    assert peak - baseline < BOUND_MB
    assert "ProtocolError" in reasons  # the short frames: the chunk length check
    assert all(r.trained == 4 for r in records)


def test_malformed_messages_on_every_device_topic_are_counted_and_the_run_finishes(
    broker, femnist_eval, tmp_path
) -> None:
    # Prepare
    run, root = "flood-all", femnist_root()
    traffic, to_server, to_agents = _traffic(run, np.random.default_rng(12))
    with start_fleet(
        root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path / "logs"
    ):
        coord = _coordinator(broker, femnist_eval, tmp_path, run)
        coord.connect()
        coord.wait_for_devices(4, timeout=120)
        coord.setup_strategy()
        records = [coord.step()]
        baseline = _rss_mb()
        memory = PeakMemory()

        # Execute
        rogue = _publish_all(broker, traffic)
        while rogue.is_alive() or len(records) < 3:
            records.append(coord.step())
        counted = _drain(coord, to_server, records)
        records.append(coord.step())
        peak = memory.stop()
        coord.stop_devices()
        coord.close()
        mark = "covey/flood-all/device/"
        logs = {d: (tmp_path / "logs" / f"{d}.log").read_text() for d in REAL}

    # Assert: the run finished, every message was dropped and counted, memory stayed bounded
    print(f"{len(traffic)} rogue messages; coordinator RSS {baseline:.0f} MB, peak {peak:.0f} MB")
    assert counted == to_server
    assert all(r.trained == 4 and r.skipped == 0 for r in records)
    assert sorted(coord.devices) == REAL
    assert peak - baseline < BOUND_MB
    per_device = {d: sum(r.rejected.get(d, 0) for r in records) for d in REAL}
    assert all(n > 0 for n in per_device.values())  # counted against the ids they used
    # the rogue is no agent's predecessor: the broker delivered none of its hand-offs
    # (devices subscribe to exactly the peers a round pairs them with; docs/protocol.md)
    assert sum(to_agents.values()) > 500
    for device in to_agents:
        assert logs[device].count(mark) == 0, device
