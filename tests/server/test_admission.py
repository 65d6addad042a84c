"""Admission control: allowlist, cap, confirmation pings at a bounded rate."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from device.protocol import Pong, Register
from server.coordinator.admission import Admission, AdmissionError, TokenBucket
from server.coordinator.registry import Registry

BODY = Register(10, 0, (4, 6), "ai_edge_litert", 100)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_token_bucket_allows_a_burst_then_the_rate() -> None:
    # Prepare
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)

    # Execute
    burst = [bucket.take() for _ in range(4)]
    clock.now += 0.5  # one token at 2 per second
    after = [bucket.take(), bucket.take()]
    clock.now += 100  # never more than the burst saved up
    later = sum(bucket.take() for _ in range(10))

    # Assert
    assert burst == [True, True, True, False]
    assert after == [True, False]
    assert later == 3


def test_only_allowlisted_ids_may_ask_to_join() -> None:
    admission = Admission(allowed=frozenset({"pi-1", "pi-2"}))

    with pytest.raises(AdmissionError, match="not on the allowlist") as refused:
        admission.request("intruder", BODY, 0)
    admission.request("pi-1", BODY, 0)

    assert refused.value.reason == "registration refused: not on the allowlist"
    assert list(admission.pending) == ["pi-1"]
    assert admission.counts == {"not on the allowlist": 1}


def test_the_cap_counts_confirmed_and_pending_devices() -> None:
    admission = Admission(max_devices=3)

    admission.request("a", BODY, n_confirmed=2)
    with pytest.raises(AdmissionError, match="the run is full"):
        admission.request("b", BODY, n_confirmed=2)
    admission.request("a", BODY, n_confirmed=2)  # the same id again keeps its place

    assert admission.counts == {"the run is full": 1}
    assert list(admission.pending) == ["a"]


def test_the_oldest_pending_registration_is_evicted_when_the_queue_is_full() -> None:
    admission = Admission(max_pending=2)

    evicted = [admission.request(d, BODY, 0) for d in ("a", "b", "c")]

    assert evicted == [[], [], ["a"]]
    assert list(admission.pending) == ["b", "c"]
    assert admission.counts == {"evicted before confirming": 1}


def test_a_site_of_1000_provisioned_boards_starting_at_once_all_wait_for_their_ping() -> None:
    # Prepare: a site's allowlist (the provisioned ids), every board registering at once,
    # as when the site's power comes back (bench/edge.py --scale found 744 of 1,000 evicted
    # and never admitted: an agent registers again only for a new coordinator)
    ids = [f"s{k:04d}" for k in range(1000)]
    admission = Admission(allowed=frozenset(ids))

    # Execute
    evicted = [d for device in ids for d in admission.request(device, BODY, 0)]

    # Assert: none is pushed out; an id off the list still is refused before it queues
    assert evicted == [] and len(admission.pending) == 1000 and admission.counts == {}
    with pytest.raises(AdmissionError, match="not on the allowlist"):
        admission.request("stranger", BODY, 0)


def test_pings_leave_at_the_rate_and_only_the_echo_of_a_ping_confirms() -> None:
    # Prepare
    clock = Clock()
    admission = Admission(rate=1.0, burst=2, repeat_s=5.0, clock=clock)
    for d in ("a", "b", "c"):
        admission.request(d, BODY, 0)

    # Execute
    first = admission.pings_due()
    again = admission.pings_due()  # no token left, and a and b were pinged just now
    clock.now += 1.0
    second = admission.pings_due()
    forged = admission.confirm("a", first[0][1] + 1e-3)
    unpinged = admission.confirm("zzz", 1.0)
    confirmed = admission.confirm("a", first[0][1])
    clock.now += 5.0
    repeat = admission.pings_due()

    # Assert
    assert [d for d, _ in first] == ["a", "b"] and again == []
    assert [d for d, _ in second] == ["c"]
    assert forged is None and unpinged is None
    assert confirmed == BODY
    assert "a" not in admission.pending
    assert [d for d, _ in repeat] == ["b", "c"]  # pinged again after repeat_s, two tokens saved up


def test_a_device_joins_the_registry_when_its_pong_echoes_the_ping() -> None:
    # Prepare
    registry = Registry(2)

    # Execute
    pending = registry.register("pi-1", BODY)
    before = set(registry.devices)
    ((device, t),) = registry.pings_due()
    joined = registry.pong("pi-1", Pong(t))
    again = registry.register("pi-1", Register(10, 0, (5, 5), "ai_edge_litert", 100))

    # Assert
    assert pending.info is None and not before
    assert device == "pi-1"
    assert joined is not None and joined.n_samples == 10
    np.testing.assert_array_equal(registry.devices["pi-1"].info.class_counts, [5, 5])
    assert again.changed and again.info is not None  # a known device registers again at once
    assert registry.devices["pi-1"].rtt_ms >= 0


def test_a_registration_repeated_before_its_ping_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: an agent registers on connecting and again on seeing the coordinator's status
    registry = Registry(2)
    caplog.set_level(logging.INFO, logger="covey.server")

    # Execute
    registry.register("pi-1", BODY)
    registry.register("pi-1", BODY)
    ((_, t),) = registry.pings_due()
    registry.pong("pi-1", Pong(t))

    # Assert: one line for the request, one for the registration
    lines = [r.getMessage() for r in caplog.records if "pi-1" in r.getMessage()]
    assert lines == [
        "device pi-1 asks to join (10 samples); confirming with a ping",
        "device pi-1 registered: 10 samples, ai_edge_litert",
    ]
