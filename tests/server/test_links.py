"""Γ and RTT matrices from link reports: every entry measured or filled, and saying which."""

from __future__ import annotations

import math

import numpy as np

from device.link import effective_snr_db
from device.protocol import LinkReport, PathReport, WifiInfo
from server.links import LinkMatrices, build_link_matrices


def report(*paths: PathReport, wifi: WifiInfo | None = None) -> LinkReport:
    return LinkReport("t", paths, wifi)


def test_measured_reverse_bottleneck_via_server_wifi_and_worst() -> None:
    # Prepare: a measured everything; b measured the server only; c reported Wi-Fi only; d nothing
    reports = {
        "a": report(
            PathReport("server", 4, 4, 2.0, 0.1, 40e6),
            PathReport("b", 4, 4, 3.0, 0.2, 20e6),
            PathReport("c", 4, 4, 5.0, 0.2, 10e6),
            PathReport("d", 4, 0),  # every probe lost
        ),
        "b": report(PathReport("server", 4, 4, 1.0, 0.1, 80e6)),
        "c": report(PathReport("server", 4, 0), wifi=WifiInfo("wlan0", "iw", -60.0, -90.0)),
    }
    server_rtt = {"a": 2.5, "b": 1.5, "c": 9.0, "d": 4.0}

    # Execute
    m = build_link_matrices(["a", "b", "c", "d"], reports, server_rtt, bandwidth_hz=20e6)

    # Assert
    src, rsrc = m.snr_source, m.rtt_source
    assert m.snr_db is not None and m.rtt_ms is not None
    assert src[0, 0] == "measured" and math.isclose(m.snr_db[0, 0], effective_snr_db(5_000_000, 1.0, 20e6) or 0)
    assert src[2, 2] == "wifi" and m.snr_db[2, 2] == 30.0
    assert src[0, 1] == "measured" and src[1, 0] == "reverse" and m.snr_db[1, 0] == m.snr_db[0, 1]
    assert src[1, 2] == "bottleneck" and m.snr_db[1, 2] == min(m.snr_db[1, 1], m.snr_db[2, 2])
    assert src[3, 3] == "worst measured" and src[0, 3] == "worst measured"
    assert m.snr_db[3, 3] == np.min(m.snr_db[np.isin(src, ["measured", "reverse", "bottleneck", "wifi"])])
    assert rsrc[0, 1] == "measured" and m.rtt_ms[0, 1] == 3.0 and rsrc[1, 0] == "reverse"
    assert rsrc[0, 3] == "via server" and m.rtt_ms[0, 3] == 2.5 + 4.0  # the server's own RTT wins over a's
    assert rsrc[1, 2] == "via server" and m.rtt_ms[1, 2] == 1.5 + 9.0
    assert (np.diag(m.rtt_ms) == 0).all() and set(np.diag(rsrc)) == {"self"}
    assert m.counts("rtt")["measured"] == 2


def test_nothing_measured_gives_no_matrix() -> None:
    m = build_link_matrices(["a", "b"], {}, {})
    assert m.snr_db is None and m.rtt_ms is None
    assert "not measured" in m.table()


def test_round_trip_through_json_and_a_readable_table() -> None:
    reports = {"a": report(PathReport("server", 3, 3, 2.0, 0.1, 40e6), PathReport("b", 3, 3, 3.0, 0.2, 20e6))}
    m = build_link_matrices(["a", "b"], reports, {"a": 2.0, "b": 3.0})
    back = LinkMatrices.from_dict(m.to_dict())
    assert back.ids == m.ids and back.snr_db is not None and m.snr_db is not None
    assert np.allclose(back.snr_db, m.snr_db, atol=1e-3) and (back.snr_source == m.snr_source).all()
    text = m.table()
    assert "SNR" in text and "RTT" in text and "3.0*" in text and "measured" in text


def test_a_link_faster_than_any_radio_ranks_best_not_worst() -> None:
    reports = {
        "a": report(PathReport("server", 3, 3, 0.5, 0.1, 1.3e9)),  # a wired LAN at B = 20 MHz: C/B = 65
        "b": report(PathReport("server", 3, 3, 9.0, 0.1, 10e6)),
    }
    m = build_link_matrices(["a", "b"], reports, {})
    assert m.snr_db is not None and m.snr_source[0, 0] == "measured"
    assert m.snr_db[0, 0] > m.snr_db[1, 1] and np.isfinite(m.snr_db[0, 0])


def test_rtt_known_only_from_the_server_is_never_filled_as_zero() -> None:
    m = build_link_matrices(["a", "b"], {}, {"a": 12.0})
    assert m.rtt_ms is not None
    assert m.rtt_ms[0, 1] == m.rtt_ms[1, 0] == 24.0 and m.rtt_source[0, 1] == "worst measured"
