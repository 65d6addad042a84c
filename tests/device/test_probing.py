"""The device's link prober: one probe in flight, RTT and goodput from echoes, lost
probes after the timeout, and a report the server can decode."""

from __future__ import annotations

from device.link import WifiReading
from device.probing import LinkProber
from device.protocol import LinkProbeRequest, LinkReport, Message, Topics, decode_message, parse_frame


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(request: LinkProbeRequest, wifi: WifiReading | None = None):  # type: ignore[no-untyped-def]
    clock, sent, reports = Clock(), [], []
    prober = LinkProber(
        "me",
        Topics("r"),
        request,
        4,
        publish=lambda topic, data, retain: sent.append((topic, parse_frame(data)[0])),
        send=lambda body, rnd: reports.append(Message.of(body, run="r", sender="me", round=rnd)),
        wifi=lambda: wifi,
        clock=clock,
    )
    return prober, clock, sent, reports


def test_rtt_and_goodput_from_echoes_and_a_lost_peer() -> None:
    # Prepare: the server answers in 10 ms (empty) and 110 ms (100 kB); peer p never answers
    request = LinkProbeRequest("lp1", ("p", "me"), probes=3, payload_bytes=100_000, timeout_s=2.0)
    prober, clock, sent, reports = make(request, WifiReading("wlan0", -55.0, None, "iw"))

    # Execute
    prober.start()
    for delay in (0.010, 0.012, 0.008, 0.110):
        topic, header = sent[-1]
        assert topic == "covey/r/from/me/frames" and header.kind == "probe"
        clock.now += delay
        assert not prober.on_echo("lp1", header.extra.index + 1, "server")  # not the probe in flight
        assert prober.on_echo("lp1", header.extra.index, "server")
    for _ in range(4):  # to p: on the direct hand-off topic, never echoed
        assert sent[-1][0] == "covey/r/device/p/frames/from/me"
        clock.now += 2.5
        prober.tick()

    # Assert
    assert prober.done and len(sent) == 8 and sent[3][1].nbytes == 100_000
    (msg,) = reports
    body = decode_message(msg.encode()).body
    assert isinstance(body, LinkReport) and msg.round == 4
    server, peer = body.paths
    assert (server.target, server.sent, server.answered) == ("server", 4, 4)
    assert server.rtt_ms is not None and abs(server.rtt_ms - 10.0) < 1e-6
    assert server.goodput_bps is not None and abs(server.goodput_bps - 8 * 100_000 / 0.110) < 1.0
    assert (peer.target, peer.sent, peer.answered, peer.rtt_ms, peer.goodput_bps) == ("p", 4, 0, None, None)
    assert body.wifi is not None and body.wifi.signal_dbm == -55.0 and body.wifi.noise_dbm is None


def test_no_wifi_is_reported_as_not_available_and_a_late_echo_is_refused() -> None:
    prober, clock, sent, reports = make(LinkProbeRequest("lp2", (), probes=1, payload_bytes=0, timeout_s=1.0))
    prober.start()
    late = sent[-1][1].extra.index
    clock.now += 1.5
    prober.tick()
    assert prober.done and not prober.on_echo("lp2", late, "server")
    body = reports[0].body
    assert body.wifi is None and body.paths[0].answered == 0 and body.paths[0].rtt_ms is None
