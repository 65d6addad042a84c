"""Fixtures for tests over a real broker: mosquitto from the repo config, agent fleets."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from device.data import Dataset, read_leaf
from device.mqtt import MqttLink
from device.protocol import Topics, decode_message, parse_frame
from device.transport import Link
from server.loopback import LoopbackBroker


@pytest.fixture(scope="session")
def broker():
    from server.broker import start_mosquitto

    with start_mosquitto() as handle:
        yield handle


@pytest.fixture(scope="session")
def femnist_eval() -> Dataset:
    from covey.paths import femnist_dir

    test = read_leaf(femnist_dir() / "test")
    return Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))


@dataclass
class Observer:
    """Subscribes to covey/<run>/# and checks that every message is one the protocol defines."""

    link: MqttLink
    topics: Topics
    seen: list[tuple[str, bytes]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            item = self.link.receive(0.2)
            if item is not None:
                self.seen.append((item.topic, item.payload))
                self.check(item.topic, item.payload)

    def check(self, topic: str, payload: bytes) -> None:
        rest = topic[len(self.topics.root) + 1 :]
        sender = self.topics.device_of(topic)
        try:
            if rest.endswith("/frames") or "/frames/from/" in rest or rest.startswith("artifact/chunk/"):
                header, _ = parse_frame(payload)
                if sender is not None:
                    assert header.sender == sender[0], f"frame from {header.sender} on {sender[0]}'s topic"
            elif rest.startswith("shared/") and "/chunk/" in rest:
                if payload:  # an empty retained message clears a shared model
                    parse_frame(payload)
            elif rest.endswith("/status") and sender is not None:
                assert payload in (b"online", b"offline"), payload
            elif rest == "server/sweep":  # the coordinator's marker to itself
                assert payload.startswith(b"sweep-"), payload
            elif rest == "artifact/manifest":
                json.loads(payload)
            elif rest.endswith(("/inbox", "/assignment", "/register", "/results")) or rest == "server/status":
                msg = decode_message(payload)
                if sender is not None:
                    assert msg.sender == sender[0], f"message from {msg.sender} on {sender[0]}'s topic"
            else:
                raise AssertionError(f"topic outside the protocol: {topic}")
        except Exception as exc:
            self.problems.append(f"{topic}: {exc}")

    def messages(self, suffix: str) -> list:  # type: ignore[type-arg]
        return [decode_message(p) for t, p in self.seen if t.endswith(suffix) and p]

    def wait_for(self, condition, timeout: float) -> None:  # type: ignore[no-untyped-def]
        """Until ``condition(seen)`` holds (a timeout fails the test)."""
        deadline = time.monotonic() + timeout
        while not condition(list(self.seen)):
            assert time.monotonic() < deadline, f"the observer did not see it within {timeout} s"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self.link.close()


@pytest.fixture
def observe(broker) -> Iterator:  # type: ignore[type-arg]
    observers: list[Observer] = []

    def start(run: str) -> Observer:
        topics = Topics(run)
        link = MqttLink(f"observer-{run}", broker.host, broker.port, clean_session=True)
        link.connect(10)
        link.subscribe(topics.everything)
        obs = Observer(link, topics)
        threading.Thread(target=obs.run, daemon=True).start()
        observers.append(obs)
        return obs

    yield start
    for obs in observers:
        obs.stop()


def register_silent_device(broker, run: str, device_id: str) -> Link:  # type: ignore[no-untyped-def]
    """A device that registers with a FEMNIST writer's counts and answers pings (so it
    passes admission), but never trains: it misses every deadline. Close the link to
    make it leave. ``broker``: mosquitto's handle, or a LoopbackBroker."""
    from device.data import class_counts
    from device.protocol import Message, Ping, Pong, Register

    if isinstance(broker, LoopbackBroker):
        link: Link = broker.link(f"silent-{device_id}")
    else:
        link = MqttLink(f"silent-{device_id}", broker.host, broker.port, clean_session=True)
    link.connect(10)
    topics = Topics(run)
    link.subscribe(topics.inbox(device_id))
    counts = class_counts(next(iter(read_leaf(femnist_root() / "train").values())).y, 62)
    body = Register(int(counts.sum()), 0, tuple(int(c) for c in counts), "ai_edge_litert", 100)
    link.publish(topics.register(device_id), Message.of(body, run=run, sender=device_id).encode(), wait=5)

    def answer_pings() -> None:
        while link.connected:
            item = link.receive(0.2)
            if item is not None and isinstance((msg := decode_message(item.payload)).body, Ping):
                pong = Message.of(Pong(msg.body.t), run=run, sender=device_id)
                link.publish(topics.results(device_id), pong.encode())

    threading.Thread(target=answer_pings, daemon=True).start()
    return link


def femnist_root() -> Path:
    from covey.paths import femnist_dir

    return femnist_dir()


def where(broker) -> tuple[str, int, dict]:  # type: ignore[no-untyped-def, type-arg]
    """``(host, port, coordinator keyword arguments)`` for a coordinator on ``broker``:
    mosquitto's handle, or a LoopbackBroker (its links for ``link_factory``)."""
    if isinstance(broker, LoopbackBroker):
        return "loopback", 0, {"link_factory": broker.link}
    return broker.host, broker.port, {}


@contextmanager
def loopback_fleet(
    root: Path, writers: list[str], *, run: str, state_dir: Path, device_ids: list[str] | None = None
) -> Iterator[LoopbackBroker]:
    """Agents on LEAF writers in this process, on a loopback broker (``server/loopback.py``),
    named as ``start_fleet`` names them: the broker, for the coordinator's ``link_factory``."""
    from server.loopback import LoopbackFleet

    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    ids = device_ids or [f"dev{i:03d}" for i in range(len(writers))]
    broker = LoopbackBroker()
    with LoopbackFleet(
        broker, {d: (train[w], test[w]) for d, w in zip(ids, writers, strict=True)}, run=run, state_dir=state_dir
    ):
        yield broker
