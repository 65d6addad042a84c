"""Find the covey server and broker on the local network with zeroconf (mDNS).

The server advertises ``_covey._tcp.local.`` with TXT records ``run`` and
``broker`` (host:port); a device that was not told where the broker is browses for
the run it wants. Every wait has a timeout.
"""

from __future__ import annotations

import socket
import time

from device.errors import TransportError

SERVICE = "_covey._tcp.local."


def advertise(run: str, broker_host: str, broker_port: int, port: int = 0):  # type: ignore[no-untyped-def]
    """Advertise a run; returns the Zeroconf handle (call ``close()`` to withdraw)."""
    from zeroconf import ServiceInfo, Zeroconf

    zc = Zeroconf()
    address = socket.inet_aton(local_ip())
    info = ServiceInfo(
        SERVICE,
        f"covey-{run}.{SERVICE}",
        addresses=[address],
        port=port or broker_port,
        properties={"run": run, "broker": f"{broker_host}:{broker_port}"},
    )
    zc.register_service(info)
    return zc


def discover(run: str | None, timeout: float = 10.0) -> tuple[str, int, str]:
    """(broker host, broker port, run) of the first matching advertisement."""
    from zeroconf import ServiceBrowser, Zeroconf

    zc = Zeroconf()
    found: list[tuple[str, int, str]] = []

    class Listener:
        def add_service(self, zc_: Zeroconf, type_: str, name: str) -> None:
            info = zc_.get_service_info(type_, name, timeout=2000)
            if info is None:
                return
            props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
            if run is not None and props.get("run") != run:
                return
            host, _, port = props.get("broker", "").rpartition(":")
            if host and port.isdigit():
                found.append((host, int(port), props.get("run", "")))

        def update_service(self, *args: object) -> None:
            pass

        def remove_service(self, *args: object) -> None:
            pass

    browser = ServiceBrowser(zc, SERVICE, Listener())  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    try:
        while not found and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        browser.cancel()
        zc.close()
    if not found:
        what = f"run {run!r}" if run else "any covey run"
        raise TransportError(
            f"no server advertising {what} found on the local network within {timeout:.0f} s; give --broker HOST:PORT"
        )
    return found[0]


def local_ip() -> str:
    """This machine's address on the network of its default route (127.0.0.1 without one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing interface
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"
