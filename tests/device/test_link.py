"""Link readers on the outputs real tools print (transcribed into tests/device/data/links
in their exact formats: a Raspberry Pi 4's brcmfmac, a laptop's iwlwifi, a driver that
prints unsigned levels, a machine without Wi-Fi, Termux on Android)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from device.link import (
    WifiReading,
    effective_snr_db,
    parse_iw_link,
    parse_iw_station_dump,
    parse_iw_survey,
    parse_proc_net_wireless,
    parse_termux_wifi,
    read_wifi,
    rtt_stats,
)

DATA = Path(__file__).parent / "data" / "links"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_proc_net_wireless_of_a_pi_a_laptop_an_unsigned_driver_and_no_wifi() -> None:
    assert parse_proc_net_wireless(text("pi4_proc_net_wireless.txt")) == [
        WifiReading("wlan0", -54.0, None, "/proc/net/wireless")  # brcmfmac: noise -256 = not reported
    ]
    (laptop,) = parse_proc_net_wireless(text("laptop_proc_net_wireless.txt"))
    assert (laptop.interface, laptop.signal_dbm, laptop.noise_dbm, laptop.snr_db) == ("wlp2s0", -46.0, -92.0, 46.0)
    (unsigned,) = parse_proc_net_wireless(text("unsigned_proc_net_wireless.txt"))
    assert (unsigned.signal_dbm, unsigned.noise_dbm) == (-54.0, -95.0)
    assert parse_proc_net_wireless(text("none_proc_net_wireless.txt")) == []
    assert parse_proc_net_wireless("") == [] and parse_proc_net_wireless("garbage: x y") == []


def test_iw_signal_noise_and_not_connected() -> None:
    assert parse_iw_link(text("pi4_iw_link.txt")) == -54.0
    assert parse_iw_link(text("iw_not_connected.txt")) is None
    assert parse_iw_station_dump(text("pi4_iw_station_dump.txt")) == -53.0  # the average, not the last frame
    assert parse_iw_survey(text("pi4_iw_survey.txt")) == -91.0  # the channel in use, not the first one
    assert parse_iw_survey("Survey data from wlan0\n\tfrequency: 2412 MHz\n") is None


def test_termux_gives_a_signal_but_no_noise() -> None:
    assert parse_termux_wifi(text("termux_wifi_connectioninfo.json")) == -58.0
    assert parse_termux_wifi(text("termux_wifi_off.json")) is None  # -127: Android does not know
    assert parse_termux_wifi("not json") is None


def _runner(outputs: dict[str, str]):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str]) -> str | None:
        return outputs.get(" ".join(argv))

    return run


def test_read_wifi_combines_what_the_board_offers(tmp_path: Path) -> None:
    # a Pi: /proc has the signal but no noise; iw's survey has the noise floor
    proc = tmp_path / "wireless"
    proc.write_text(text("pi4_proc_net_wireless.txt"))
    pi = read_wifi(
        proc,
        _runner({"iw dev wlan0 link": text("pi4_iw_link.txt"), "iw dev wlan0 survey dump": text("pi4_iw_survey.txt")}),
    )
    assert pi == WifiReading("wlan0", -54.0, -91.0, "iw") and pi.snr_db == 37.0
    # the same Pi without iw installed: the signal, and the SNR "not available"
    alone = read_wifi(proc, _runner({}))
    assert alone is not None and alone.snr_db is None
    # a machine without Wi-Fi, or without /proc/net/wireless at all
    proc.write_text(text("none_proc_net_wireless.txt"))
    assert read_wifi(proc, _runner({})) is None
    assert read_wifi(tmp_path / "missing", _runner({})) is None
    # Android under Termux
    termux = read_wifi(
        tmp_path / "missing", _runner({"termux-wifi-connectioninfo": text("termux_wifi_connectioninfo.json")})
    )
    assert termux == WifiReading("wlan0", -58.0, None, "termux")


def test_read_wifi_on_this_machine_never_raises() -> None:
    reading = read_wifi()
    assert reading is None or isinstance(reading, WifiReading)


@pytest.mark.parametrize(
    ("n_bytes", "seconds", "bandwidth", "expected"),
    [
        (1_250_000, 1.0, 20e6, 10 * math.log10(2**0.5 - 1)),  # 10 Mbit/s on 20 MHz
        (25_000_000, 1.0, 20e6, 10 * math.log10(2**10 - 1)),  # 200 Mbit/s on 20 MHz: about 30 dB
    ],
)
def test_goodput_gives_the_shannon_snr(n_bytes: int, seconds: float, bandwidth: float, expected: float) -> None:
    assert effective_snr_db(n_bytes, seconds, bandwidth) == pytest.approx(expected)


def test_goodput_that_says_nothing_gives_no_snr() -> None:
    assert effective_snr_db(0, 1.0, 20e6) is None
    assert effective_snr_db(10, 0.0, 20e6) is None
    assert effective_snr_db(10**9, 0.001, 20e6) is None  # 8 Tbit/s: loopback, not a radio


def test_rtt_stats_are_median_and_spread_of_sane_probes() -> None:
    stats = rtt_stats([10.0, 12.0, 11.0, 50.0, float("nan"), -3.0])
    assert stats is not None and stats.n == 4 and stats.median_ms == 11.5
    assert rtt_stats([]) is None and rtt_stats([float("inf")]) is None
