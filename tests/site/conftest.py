"""Fixtures for site tests: a site made by the real command, its mosquitto, clients of it.

Sites live in ``site_parent`` (tests/conftest.py), a folder every user can enter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from covey.cli import main
from device.mqtt import MqttLink, TlsFiles
from server.broker import BrokerHandle, free_port, run_mosquitto
from server.site import Site, load_site


def init(folder: Path, *devices: str, extra: tuple[str, ...] = ()) -> Site:
    """``covey site init`` as a user types it: TLS on a free port, loopback listener on another."""
    argv = ["site", "init", str(folder), "--host", "localhost", "--ip", "127.0.0.1", "--run", "siterun"]
    argv += ["--port", str(free_port()), "--loopback-port", str(free_port()), *extra, "--devices", *devices]
    assert main(argv) == 0
    return load_site(folder)


@dataclass
class SiteBroker:
    site: Site
    handle: BrokerHandle
    links: list[MqttLink] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.site.spec.port

    def folder(self, user: str) -> Path:
        """Where ``user``'s credentials are: the coordinator's folder or a device bundle."""
        return self.site.layout.coordinator_dir if user == "coordinator" else self.site.layout.bundle(user)

    def password(self, user: str) -> str:
        return (self.folder(user) / "password").read_text().strip()

    def tls(self, user: str | None, ca: Path | None = None) -> TlsFiles:
        """TLS with the site's CA (or ``ca``) and ``user``'s client certificate if it has one."""
        cert = self.folder(user) / "client.crt" if user else None
        has_cert = cert is not None and cert.exists()
        key = str(self.folder(str(user)) / "client.key") if has_cert else None
        return TlsFiles(str(ca or self.site.layout.ca_cert), str(cert) if has_cert else None, key)

    def link(
        self,
        user: str | None,
        *,
        client_id: str | None = None,
        password: str | None = None,
        ca: Path | None = None,
        host: str = "127.0.0.1",
    ) -> MqttLink:
        """A clean-session client over TLS as ``user`` (a device id or ``coordinator``),
        with that user's password, certificate and the site's CA unless given."""
        if password is None and user is not None:
            password = self.password(user)
        return MqttLink(
            client_id or f"test-{user}",
            host,
            self.port,
            username=user,
            password=password,
            tls=self.tls(user, ca),
            clean_session=True,
        )

    def connected(self, user: str, **kwargs: Any) -> MqttLink:
        link = self.link(user, **kwargs)
        link.connect(10)
        self.links.append(link)
        return link


@pytest.fixture
def site_broker(site_parent: Path) -> Iterator[Callable[..., SiteBroker]]:
    """``site_broker(*devices, extra=(...))``: a site made by ``covey site init`` and its
    mosquitto, started from the generated config and stopped even when the test fails."""
    started: list[SiteBroker] = []

    def start(*devices: str, extra: tuple[str, ...] = ()) -> SiteBroker:
        site = init(site_parent / f"site{len(started)}", *devices, extra=extra)
        log = site_parent / f"mosquitto{len(started)}.log"
        broker = SiteBroker(site, run_mosquitto(site.layout.broker_conf, "127.0.0.1", site.spec.port, log=log))
        started.append(broker)
        return broker

    yield start
    for broker in started:
        for link in broker.links:
            link.close()
        broker.handle.stop()
