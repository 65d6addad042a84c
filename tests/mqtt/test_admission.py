"""Probe: 5,000 fake registrations. Before admission control every one became a device,
a round sampled four of them and the run aborted at the deadline ("no client returned a
model this round"). Now a site run refuses every id it did not provision, an open run
admits only devices that answer their confirmation ping, and the run finishes."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from device.mqtt import MqttLink
from device.protocol import Message, Register, Topics
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.fleet import leaf_writers, start_fleet
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
FAKES = 5000
REAL = [f"dev{i:03d}" for i in range(4)]


def _flood(broker, run: str) -> float:  # type: ignore[no-untyped-def]
    """Publish FAKES registrations with distinct ids; returns the seconds it took."""
    rogue = MqttLink("rogue-registrar", broker.host, broker.port, clean_session=True)
    rogue.connect(10)
    topics = Topics(run)
    counts = tuple([1] * 62)
    start = time.monotonic()
    for i in range(FAKES):
        fake = f"fake{i:05d}"
        body = Register(62, 0, counts, "ai_edge_litert", 100)
        rogue.publish(topics.register(fake), Message.of(body, run=run, sender=fake).encode())
    rogue.publish(topics.register("fake-last"), b"{}", wait=60)  # everything before it is on the broker
    seconds = time.monotonic() - start
    rogue.close()
    return seconds


def _handled(coord: Coordinator) -> int:
    """Fake registrations the coordinator dealt with: admitted, refused, evicted or pending."""
    admission = getattr(coord.registry, "admission", None)
    waiting = len(admission.pending) if admission is not None else 0
    return len(coord.devices) - len(REAL) + sum(coord.bus.drops.by_reason.values()) + waiting


@pytest.mark.parametrize("mode", ["open", "site"])
def test_a_flood_of_fake_registrations_does_not_stop_the_run(broker, femnist_eval, tmp_path, mode: str) -> None:
    from covey.paths import ensure_model

    # Prepare
    run, root = f"admission-{mode}", femnist_root()
    allowed = frozenset(REAL) if mode == "site" else None
    with start_fleet(
        root, leaf_writers(root, 4), run=run, host=broker.host, port=broker.port, log_dir=tmp_path / "logs"
    ):
        config = CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", deadline_s=20.0)
        if allowed is not None:
            config.allowed_devices = allowed
        coord = Coordinator(
            config,
            make_strategy("fedavg", train=TrainConfig(1, 10, 0.01), clients_per_round=4),
            ensure_model("mlp_femnist"),
            femnist_eval,
        )
        coord.connect()
        coord.wait_for_devices(4, timeout=120)

        # Execute: the flood, then two rounds
        flood_s = _flood(broker, run)
        deadline = time.monotonic() + 120
        while _handled(coord) < FAKES:
            assert time.monotonic() < deadline, f"only {_handled(coord)} of {FAKES} fake registrations handled"
            coord.pump(0.2)
        coord.setup_strategy()
        records = [coord.step() for _ in range(2)]
        counts = dict(coord.registry.admission.counts)
        pending = len(coord.registry.admission.pending)
        coord.stop_devices()
        coord.close()

    # Assert: only the real devices joined, every fake is accounted for, the run finished
    assert sorted(coord.devices) == REAL
    assert all(r.trained == 4 and r.skipped == 0 for r in records)
    assert np.isfinite(records[-1].server_accuracy)
    if mode == "site":
        assert counts == {"not on the allowlist": FAKES}
        assert records[0].dropped["registration refused: not on the allowlist"] == FAKES
    else:
        assert counts["evicted before confirming"] + pending == FAKES
        assert records[0].dropped["registration evicted before confirming"] == counts["evicted before confirming"]
    print(f"{FAKES} fake registrations published in {flood_s:.1f} s ({mode} run)")


def test_boards_pushed_out_of_a_full_admission_queue_register_again_and_join(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: an open run whose admission queue holds one registration, and three boards
    # registering at once: two are evicted unanswered (bench/edge.py --scale lost 744 of
    # 1,000 so, and the run waited for them until its timeout)
    import device.agent
    from covey.paths import ensure_model
    from server.coordinator.admission import Admission
    from server.lab.edges import federation
    from server.loopback import LoopbackBroker, LoopbackFleet

    monkeypatch.setattr(device.agent, "REREGISTER_S", 1.0, raising=False)
    broker, run = LoopbackBroker(), "readmit"
    data = federation(femnist_root(), REAL[:3])
    config = CoordinatorConfig(run, "", 0, tmp_path / "state", deadline_s=20.0)
    coord = Coordinator(
        config,
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.01), clients_per_round=3),
        ensure_model("mlp_femnist"),
        link_factory=broker.link,
    )
    coord.registry.admission = Admission(max_pending=1)
    coord.connect()
    try:
        with (
            caplog.at_level(logging.INFO, logger="covey.device"),
            LoopbackFleet(broker, {d: (c.train, c.test) for d, c in data.items()}, run=run, state_dir=tmp_path),
        ):
            # the three registrations wait in the coordinator's queue until it reads them
            # (on a loaded machine the boards' start is otherwise too spread out to collide)
            deadline = time.monotonic() + 60
            while sum("registered (" in r.getMessage() for r in caplog.records) < 3:
                assert time.monotonic() < deadline, "the boards did not register within 60 s"
                time.sleep(0.05)

            # Execute
            coord.wait_for_devices(3, timeout=60)

            # Assert: every board joined; at least one had been pushed out first
            assert sorted(coord.devices) == REAL[:3]
            assert coord.registry.admission.counts.get("evicted before confirming", 0) >= 1
            coord.stop_devices()
    finally:
        coord.close()


def test_a_board_nobody_answers_registers_again_ever_less_often(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: a coordinator that published its status and model but reads no
    # registration (as one whose queue lost it), and one board; the waits between its
    # registrations shrunk from 60 s (doubling up to 960 s) to 0.25 s (up to 1 s)
    import device.agent
    from covey.paths import ensure_model
    from server.lab.edges import federation
    from server.loopback import LoopbackBroker, LoopbackFleet

    monkeypatch.setattr(device.agent, "REREGISTER_S", 0.25)
    monkeypatch.setattr(device.agent, "REREGISTER_MAX_S", 1.0)
    broker, run = LoopbackBroker(), "unanswered"
    data = federation(femnist_root(), REAL[:1])
    config = CoordinatorConfig(run, "", 0, tmp_path / "state", deadline_s=20.0)
    coord = Coordinator(
        config,
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.01)),
        ensure_model("mlp_femnist"),
        link_factory=broker.link,
    )
    coord.connect()
    again = "since registering; registering again"
    try:
        with (
            caplog.at_level(logging.INFO, logger="covey.device"),
            LoopbackFleet(broker, {d: (c.train, c.test) for d, c in data.items()}, run=run, state_dir=tmp_path),
        ):
            # Execute: wait for its fourth registration after the first
            deadline = time.monotonic() + 60
            while sum(again in r.getMessage() for r in caplog.records) < 4:
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                time.sleep(0.05)
    finally:
        coord.close()

    # Assert: each wait twice the one before, up to the cap, and each followed by a registration
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(REAL[0])]
    waits = [float(m.split("no request in ")[1].split()[0]) for m in said if again in m]
    assert waits[:4] == [0.25, 0.5, 1.0, 1.0], said
    registered = [i for i, m in enumerate(said) if "registered (" in m]
    for i, m in enumerate(said):
        if again in m:
            assert i + 1 in registered, said
