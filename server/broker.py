"""Start or locate an MQTT broker: mosquitto (production, tests) or embedded amqtt (demo).

mosquitto runs from ``firmware_scripts/mosquitto/covey-local.conf`` with the port
filled in; the embedded broker is amqtt in a child process, so a demo needs nothing
installed but Python packages.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from device.errors import TransportError

REPO = Path(__file__).resolve().parent.parent
LOCAL_CONF = REPO / "firmware_scripts" / "mosquitto" / "covey-local.conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((host, port)) == 0:
                return
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


def start_mosquitto(port: int | None = None, config: Path = LOCAL_CONF, timeout: float = 10.0) -> BrokerHandle:
    """mosquitto on 127.0.0.1 from the repo's config, on a free port unless given."""
    port = port or free_port()
    workdir = tempfile.TemporaryDirectory(prefix="covey-mosquitto-")
    conf = Path(workdir.name) / "mosquitto.conf"
    conf.write_text(config.read_text().replace("{port}", str(port)))
    log = (Path(workdir.name) / "mosquitto.log").open("wb")
    proc = subprocess.Popen([mosquitto_binary(), "-c", str(conf)], stdout=log, stderr=log)
    handle = BrokerHandle("127.0.0.1", port, "mosquitto", proc, workdir)
    try:
        wait_for_port("127.0.0.1", port, timeout)
    except TransportError:
        handle.stop()
        raise
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
