"""Γ and RTT matrices from link reports: every entry measured or filled, and saying which."""

from __future__ import annotations

import math

import numpy as np

from device.link import effective_snr_db, shannon_snr_db
from device.protocol import InboundTransfer, LinkReport, PathReport, WifiInfo
from server.links import (
    MAX_PROBE_PEERS,
    MIN_RATE_INTERVAL_S,
    TRANSFER_SAMPLES,
    LinkBook,
    LinkMatrices,
    build_link_matrices,
    probe_peers,
)


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


def test_model_transfers_take_precedence_over_probes_and_fill_what_probes_missed() -> None:
    # Prepare: a probed everything at 40 Mbit/s to the server; then a's uploads ran at 8,
    # a handed models to b at 4; c was never probed, but the server's models reached it at 2
    reports = {"a": report(PathReport("server", 3, 3, 2.0, 0.1, 40e6), PathReport("b", 3, 3, 3.0, 0.2, 20e6))}
    book = LinkBook(20e6)
    book.reports.update(reports)
    for seconds in (1.0, 1.0, 0.5):  # 8, 8 and 16 Mbit/s: the median is 8
        book.add_transfer("a", "server", 1_000_000, seconds)
    book.add_transfer("a", "b", 500_000, 1.0)
    book.add_transfer("server", "c", 250_000, 1.0)

    # Execute
    m = book.matrices(["a", "b", "c"])

    # Assert
    src = m.snr_source
    assert m.snr_db is not None
    assert src[0, 0] == "transfer" and math.isclose(m.snr_db[0, 0], shannon_snr_db(8e6, 20e6))
    assert src[0, 1] == "transfer" and math.isclose(m.snr_db[0, 1], shannon_snr_db(4e6, 20e6))
    assert src[1, 0] == "reverse" and m.snr_db[1, 0] == m.snr_db[0, 1]
    assert src[2, 2] == "reverse" and math.isclose(m.snr_db[2, 2], shannon_snr_db(2e6, 20e6))  # downlink only
    assert f"{m.snr_db[0, 0]:.1f}m" in m.table()  # marked as model transfers
    assert m.counts("snr")["transfer"] == 2


def test_a_path_stands_for_its_latest_transfers_and_nonsense_is_not_counted() -> None:
    book = LinkBook(20e6)
    assert book.add_transfer("a", "server", 0, 1.0) is None
    assert book.add_transfer("a", "server", 1000, float("nan")) is None
    assert book.add_transfer("a", "server", 1000, -1.0) is None
    assert book.add_transfer("a", "a", 1000, 1.0) is None
    assert book.add_transfer("a", "server", 1_000_000, 0.9 * MIN_RATE_INTERVAL_S) is None  # too quick to time
    assert book.transfers == {}
    for k in range(TRANSFER_SAMPLES + 4):  # a link that got slower: only the latest count
        book.add_transfer("a", "server", 1_000_000 if k < 4 else 125_000, 1.0)
    assert book.transfer_bps() == {("a", "server"): 1e6}
    before = book.matrices(["a"])
    book.add_transfer("a", "server", 250_000, 1.0)
    assert book.matrices(["a"]) is not before  # a new transfer refreshes the matrices


def test_a_timed_model_from_anyone_but_its_sender_is_refused_with_the_reason() -> None:
    book = LinkBook(20e6)
    sources = {"server", "a"}  # b's task: the server, or its predecessor a with direct hand-offs
    assert book.add_inbound("b", InboundTransfer("a", 1_000_000, 1.0), sources) is None
    assert book.add_inbound("b", InboundTransfer("server", 1_000_000, 2.0), sources) is None
    for spoofed in ("b", "c", "ghost"):  # itself, a device that sent it nothing, one not registered
        why = book.add_inbound("b", InboundTransfer(spoofed, 1_000_000, 0.001), sources)
        assert why is not None and repr(spoofed) in why and "did not send it one" in why
    assert book.transfer_bps() == {("a", "b"): 8e6, ("server", "b"): 4e6}


def test_a_large_site_probes_at_most_256_peers_each_and_every_pair_one_way() -> None:
    online = [f"d{i:03d}" for i in range(300)]
    plans = [probe_peers(online, k) for k in range(len(online))]
    assert all(len(p) == MAX_PROBE_PEERS == 256 for p in plans)  # the request's limit
    assert all(online[k] not in p for k, p in enumerate(plans))
    assert plans[0][0] == "d001" and plans[299][0] == "d000"  # each starts after itself: slices differ
    probed = {(online[k], peer) for k, p in enumerate(plans) for peer in p}
    assert all((a, b) in probed or (b, a) in probed for a in online for b in online if a != b)
    assert probe_peers(online[:4], 1) == ("d002", "d003", "d000")  # a small site: everyone
