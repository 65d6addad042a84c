"""Who a link measurement asks, over a real mosquitto (docs/links.md, "Settings").

Five registered devices that never answer a probe; one of them has gone offline (its
retained status says so). The coordinator asks only online devices, one at a time
(``link_probe_parallel`` 1), and stops asking once ``link_measure_max_s`` has passed:
the first device is asked, waited for and given up on; the rest are not asked this
time, and the log says how many.
"""

from __future__ import annotations

import logging
import time

import pytest

from device.protocol import LinkProbeRequest, Topics
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import register_silent_device

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_offline_devices_are_not_asked_and_the_time_cap_stops_further_requests(
    broker, observe, tmp_path, caplog
) -> None:
    from covey.paths import ensure_model

    # Prepare: s0 ... s4 registered; s4 then went offline
    run = "link-schedule"
    observer = observe(run)
    coord = Coordinator(
        CoordinatorConfig(run, broker.host, broker.port, tmp_path / "state", link_measure_max_s=0.5),
        make_strategy("fedavg", train=TrainConfig(1, 10, 0.01)),
        ensure_model("mlp_femnist"),
    )
    coord.connect()
    devices = [register_silent_device(broker, run, f"s{i}") for i in range(5)]
    try:
        coord.wait_for_devices(5, 60)
        devices[4].publish(Topics(run).status("s4"), b"offline", retain=True, wait=5)
        deadline = time.monotonic() + 10
        while coord.devices["s4"].online and time.monotonic() < deadline:  # until the coordinator has seen it
            coord.pump(0.05)
        assert not coord.devices["s4"].online

        # Execute: each wave waits 1 s for its report; after the first, 0.5 s have passed
        with caplog.at_level(logging.INFO, logger="covey.server"):
            m = coord.measure_links(timeout=1.0)
        observer.wait_for(lambda seen: any(t.endswith("s0/inbox") for t, _ in seen), timeout=10)
        coord.pump(0.5)  # anything else in flight reaches the observer meanwhile
    finally:
        for link in devices:
            link.close()
        coord.close()

    # Assert
    asked = sorted(
        t.split("/")[-2]
        for t, p in observer.seen
        if t.endswith("/inbox") and p and isinstance(_body(p), LinkProbeRequest)
    )
    assert asked == ["s0"], asked  # s4 offline; s1-s3 after the cap
    request = next(
        _body(p) for t, p in observer.seen if t.endswith("s0/inbox") and isinstance(_body(p), LinkProbeRequest)
    )
    assert request.peers == ("s1", "s2", "s3")  # online peers only
    text = caplog.text
    assert "measuring the links of 4 devices" in text
    assert "3 devices not asked this time (link_measure_max_s)" in text
    assert "no link report from s0" in text
    assert m.ids == ("s0", "s1", "s2", "s3", "s4")  # the matrices still cover every device (filled)


def _body(payload: bytes) -> object:
    from device.protocol import decode_message

    return decode_message(payload).body
