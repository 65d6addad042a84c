"""`covey broker run`'s view of mosquitto's log (server/site/broker_log.py)."""

from __future__ import annotations

from server.site.broker_log import DeniedCounter, with_denials


def _denied(client: str, topic: str) -> str:
    return f"1795750895: Denied PUBLISH from {client} (d0, q1, r0, m1, '{topic}', ... (1 bytes))"


def test_a_flood_of_refusals_is_one_line_then_one_count_per_client() -> None:
    now = [0.0]
    counter = DeniedCounter(every_s=10, clock=lambda: now[0])
    shown: list[str] = []
    for i in range(5000):
        now[0] = i * 0.001
        shown += counter.feed(_denied("dev003", f"covey/r/device/dev004/inbox/{i}"))
    shown += counter.feed(_denied("dev007", "covey/r/server/status"))
    now[0] = 11.0
    shown += counter.feed("1795750900: Received PINGREQ from dev003")
    assert shown == [
        "mosquitto: the ACL refused a PUBLISH by dev003 to 'covey/r/device/dev004/inbox/0' (further refusals counted)",
        "mosquitto: the ACL refused a PUBLISH by dev007 to 'covey/r/server/status' (further refusals counted)",
        "mosquitto: the ACL refused 4,999 more publishes or subscriptions by dev003 in 11 s "
        "(last to 'covey/r/device/dev004/inbox/4999')",
    ]


def test_the_packet_trace_is_dropped_and_everything_else_shown() -> None:
    counter = DeniedCounter()
    lines = [
        "1795750879: Received PUBLISH from x (d0, q1, r1, m1, 't/0', ... (1000000 bytes))",
        "1795750879: Sending PUBACK to x (m1, rc0)",
        "1795750879: Client x disconnected due to out of memory.",
        "1795750880: New client connected from 127.0.0.1:60019 as x (p2, c1, k60).",
    ]
    shown = [out for line in lines for out in counter.feed(line)]
    assert shown == lines[2:]


def test_the_running_config_adds_every_log_type() -> None:
    text = with_denials("listener 1883\nallow_anonymous false\n")
    assert text.startswith("listener 1883\nallow_anonymous false\n")
    assert [line for line in text.splitlines() if line.startswith("log_type")] == [
        f"log_type {kind}" for kind in ("error", "warning", "notice", "information", "debug")
    ]
