"""The link emulator's relay: latency both ways, order kept under jitter, loss as
retransmission waits, and outages that cut and refuse connections, then recover."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from server.field.relay import Impairment, Relay


@pytest.fixture
def echo_server():  # type: ignore[no-untyped-def]
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue

            def echo(c: socket.socket) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    stop.set()
    srv.close()


def _relay(port: int, impairment: Impairment) -> Relay:
    return Relay(("127.0.0.1", 0), ("127.0.0.1", port), impairment, seed=1).start()


def _round_trip(port: int, payload: bytes, timeout: float = 20.0) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        start = time.monotonic()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            assert chunk, "the relay closed the connection"
            got += chunk
        return got, time.monotonic() - start


def test_latency_is_added_each_way_and_jitter_never_reorders(echo_server) -> None:
    relay = _relay(echo_server, Impairment(latency_ms=60, jitter_ms=40))
    try:
        payload = np.random.default_rng(0).integers(0, 256, 2_000_000, dtype=np.uint8).tobytes()
        _, small = _round_trip(relay.port, b"ping")
        got, _ = _round_trip(relay.port, payload)
    finally:
        relay.stop()
    assert small >= 0.120  # 60 ms to the server and 60 ms back, at least
    assert got == payload  # every byte, in order, though each chunk's delay varies


def test_loss_holds_chunks_back_a_retransmission_timeout(echo_server) -> None:
    relay = _relay(echo_server, Impairment(loss=0.99, rto_ms=150))
    try:
        _, elapsed = _round_trip(relay.port, b"x" * 10)
    finally:
        relay.stop()
    assert elapsed >= 0.150  # at least one of the two directions waited


def _back_after_outage(port: int, timeout: float = 10.0) -> bytes:
    """A round trip through the relay once its outage ended (``AssertionError`` if not
    within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, _ = _round_trip(port, b"c", timeout=5)
            return got
        except (AssertionError, OSError):
            assert time.monotonic() < deadline, "the relay did not come back"
            time.sleep(0.1)


def _closed(s: socket.socket) -> bool:
    """The peer closed (FIN) or reset the connection."""
    try:
        return s.recv(10) == b""
    except ConnectionResetError:
        return True


@pytest.mark.slow
def test_an_outage_cuts_and_refuses_connections_then_ends(echo_server) -> None:
    relay = _relay(echo_server, Impairment())
    try:
        s = socket.create_connection(("127.0.0.1", relay.port), 5)
        s.sendall(b"a")
        assert s.recv(10) == b"a"
        relay.outage(1.5)
        s.settimeout(5)
        assert _closed(s)  # cut
        s.close()
        during = socket.create_connection(("127.0.0.1", relay.port), 5)
        during.settimeout(5)
        during.sendall(b"b")
        assert _closed(during)  # refused while down
        during.close()
        got = _back_after_outage(relay.port)
        assert got == b"c"
    finally:
        relay.stop()


def test_bad_impairments_are_refused() -> None:
    with pytest.raises(ValueError, match="loss"):
        Impairment(loss=1.5)
    with pytest.raises(ValueError, match=">= 0"):
        Impairment(latency_ms=-1)


def test_a_rated_relay_is_one_link_that_every_connection_shares() -> None:
    # Prepare: a relay whose uplink carries 8 Mbit/s (1 MB a second)
    relay = Relay(("127.0.0.1", 0), ("127.0.0.1", 9), Impairment(rate_mbit=8.0))

    # Execute: two connections each hand it 1 MB at once, then a reply comes back
    first = relay._sent_at("up", 1_000_000)
    second = relay._sent_at("up", 1_000_000)
    reply = relay._sent_at("down", 1000)

    # Assert: the second waits for the first (one link), the other direction does not,
    # and the bytes are counted per direction
    assert second - first == pytest.approx(1.0, abs=0.01)
    assert reply < first
    assert relay.carried == {"up": 2_000_000, "down": 1000}


def test_an_unrated_relay_counts_bytes_and_holds_nothing_back(echo_server: int) -> None:
    relay = Relay(("127.0.0.1", 0), ("127.0.0.1", echo_server)).start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as c:
            c.sendall(b"x" * 5000)
            got = b""
            while len(got) < 5000:
                got += c.recv(65536)
    finally:
        relay.stop()
    assert relay.carried == {"up": 5000, "down": 5000}


@pytest.mark.slow
def test_an_outage_that_stops_listening_refuses_connections_then_ends(echo_server) -> None:  # type: ignore[no-untyped-def]
    relay = _relay(echo_server, Impairment())
    try:
        s = socket.create_connection(("127.0.0.1", relay.port), 5)
        s.sendall(b"a")
        assert s.recv(10) == b"a"  # through: the relay holds it
        relay.outage(1.5, stop_listening=True)
        s.settimeout(5)
        assert _closed(s)  # cut
        s.close()
        deadline = time.monotonic() + 5
        while True:  # refused at once, not accepted and closed (what a TLS bridge needs)
            try:
                socket.create_connection(("127.0.0.1", relay.port), 5).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "the relay still accepts"
            time.sleep(0.02)
        got = _back_after_outage(relay.port)
        assert got == b"c"
    finally:
        relay.stop()
