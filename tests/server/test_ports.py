"""The execution layer's bus port on boards (server/execution/ports.py): PolledBus waits
on the coordinator's receive loop, never past the managers' next deadline."""

from __future__ import annotations

import pytest

from server.execution.ports import POLL_S, PolledBus


def test_a_polled_bus_waits_at_most_a_poll_and_never_past_the_deadline() -> None:
    now = [100.0]
    timeouts: list[float] = []
    sent: list[tuple[str, bytes, bool]] = []
    bus = PolledBus(lambda t, d, r: sent.append((t, d, r)), timeouts.append, clock=lambda: now[0])

    bus.wait(until=100.0 + 30.0)  # a deadline far off: one poll at most
    bus.wait(until=100.0 + POLL_S / 5)  # a deadline sooner than a poll
    bus.wait(until=99.0)  # a deadline passed: look, do not wait
    bus.publish("covey/r/device/d1/inbox", b"x", False)

    assert timeouts == pytest.approx([POLL_S, POLL_S / 5, 0.0])
    assert sent == [("covey/r/device/d1/inbox", b"x", False)]
