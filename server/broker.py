"""Start or locate an MQTT broker: mosquitto (production, tests) or embedded amqtt (demo).

mosquitto runs from ``firmware_scripts/mosquitto/covey-local.conf`` with the port
filled in; the embedded broker is amqtt in a child process, so a demo needs nothing
installed but Python packages.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from device.errors import ConfigError, TransportError

REPO = Path(__file__).resolve().parent.parent
LOCAL_CONF = REPO / "firmware_scripts" / "mosquitto" / "covey-local.conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Until ``host:port`` accepts TCP connections; also gives up when ``process`` exits."""
    deadline = time.monotonic() + timeout
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    while time.monotonic() < deadline:
        with socket.socket(family) as s:
            s.settimeout(0.2)
            if s.connect_ex((host, port)) == 0:
                return
        if process is not None and process.poll() is not None:
            raise TransportError(f"the broker for {host}:{port} exited at start (status {process.returncode})")
        time.sleep(0.05)
    raise TransportError(f"broker on {host}:{port} did not start within {timeout:.0f} s")


@dataclass
class BrokerHandle:
    host: str
    port: int
    kind: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    workdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.workdir is not None:
            self.workdir.cleanup()

    def __enter__(self) -> BrokerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    if not found:
        raise TransportError("mosquitto is not installed: `sudo apt-get install mosquitto` (./dev does it)")
    return found


def start_mosquitto(
    port: int | None = None, config: Path = LOCAL_CONF, timeout: float = 10.0, listen: str = "127.0.0.1"
) -> BrokerHandle:
    """mosquitto from the repo's config (anonymous clients), on a free port unless given.

    ``listen`` is the address it binds: ``127.0.0.1`` (the default) keeps it to this
    machine; ``0.0.0.0`` or a LAN address lets boards on other machines reach it. The
    handle's host is where a client on this machine connects."""
    port = port or free_port()
    workdir = tempfile.TemporaryDirectory(prefix="covey-mosquitto-")
    conf = Path(workdir.name) / "mosquitto.conf"
    conf.write_text(local_config_text(config, port, listen))
    return run_mosquitto(conf, connect_host(listen), port, timeout=timeout, workdir=workdir)


def local_config_text(config: Path, port: int, listen: str = "127.0.0.1") -> str:
    """The local config with its port filled in and its listener bound to ``listen``."""
    text = config.read_text().replace("{port}", str(port))
    return text.replace(f"listener {port} 127.0.0.1", f"listener {port} {listen}")


def connect_host(listen: str) -> str:
    """Where a client on this machine reaches a listener bound to ``listen``."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(listen, listen)


def check_listen(listen: str) -> str:
    """``--listen``: an IP address of this machine, or a wildcard for every interface."""
    try:
        return str(ipaddress.ip_address(listen))
    except ValueError:
        raise ConfigError(
            f"--listen must be an IP address to bind: 127.0.0.1 (this machine only), 0.0.0.0 (every "
            f"interface) or one of this machine's LAN addresses, got {listen!r}"
        ) from None


WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advertised_host(host: str, lan_ip: Callable[[], str] | None = None) -> str:
    """The broker address to announce to boards for a broker bound to (or reached at)
    ``host``: a wildcard bind address (every interface) becomes this machine's LAN
    address (``lan_ip``, default :func:`device.discovery.local_ip`), never 127.0.0.1,
    which a board would take for itself. Any other address is announced as it is."""
    if host not in WILDCARDS:
        return host
    from device.discovery import local_ip

    return (lan_ip or local_ip)()


def run_mosquitto(
    conf: Path,
    host: str,
    port: int,
    *,
    timeout: float = 10.0,
    log: Path | None = None,
    workdir: tempfile.TemporaryDirectory[str] | None = None,
) -> BrokerHandle:
    """mosquitto with the config file ``conf``, once ``host:port`` accepts connections.

    Its output goes to ``log`` (default: a file in ``workdir``); when it exits before
    the port opens (a port in use, a file it cannot read), the error says what it printed."""
    if workdir is None and log is None:
        workdir = tempfile.TemporaryDirectory(prefix="covey-mosquitto-")
    log = log or Path(workdir.name) / "mosquitto.log"  # type: ignore[union-attr]
    with log.open("wb") as out:
        proc = subprocess.Popen([mosquitto_binary(), "-c", str(conf)], stdout=out, stderr=out)
    handle = BrokerHandle(host, port, "mosquitto", proc, workdir)
    try:
        wait_for_port(host, port, timeout, proc)
    except TransportError as exc:
        handle.stop()
        said = [line for line in log.read_text(errors="replace").splitlines() if "rror" in line]
        raise TransportError(f"{exc}{': ' + said[-1] if said else ''} (mosquitto -c {conf})") from None
    return handle


def start_embedded(port: int | None = None, timeout: float = 15.0) -> BrokerHandle:
    """amqtt in a child process (``python -m server.broker PORT``)."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.broker", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    handle = BrokerHandle("127.0.0.1", port, "amqtt", proc)
    try:
        wait_for_port("127.0.0.1", port, timeout)
    except TransportError:
        handle.stop()
        raise
    return handle


def _serve_amqtt(port: int) -> None:
    import asyncio
    import logging

    from amqtt.broker import Broker

    logging.basicConfig(level=logging.ERROR)

    async def main() -> None:
        broker = Broker(
            {
                "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": 0}},
                "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
            }
        )
        await broker.start()
        await asyncio.Event().wait()

    asyncio.run(main())


if __name__ == "__main__":
    _serve_amqtt(int(sys.argv[1]))
