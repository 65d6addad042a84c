"""Identity the broker enforces: a real mosquitto running the config `covey site init` wrote.

Every test starts mosquitto from the generated config on free ports, talks TLS with
the generated CA, and stops the broker even when it fails. mosquitto drops a denied
publish silently under MQTT 3.1.1 (the publisher still gets its PUBACK), so a
forbidden publish is shown to be dropped by an observer logged in as the coordinator
(who may read everything): the attacker then publishes an allowed marker, and the
observer, which receives one publisher's messages in order, sees the marker and
never the forbidden message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from device.errors import TransportError
from device.mqtt import Incoming, MqttLink
from device.protocol import FrameExtra, FrameKind, Message, Register, Stop, Topics, TrainResult, encode_frames
from server.site.certs import make_ca
from tests.site.conftest import SiteBroker

pytestmark = pytest.mark.broker

RUN = "siterun"
T = Topics(RUN)


def drain_until(link: MqttLink, done: Callable[[Incoming], bool], timeout: float = 10.0) -> list[Incoming]:
    """Everything ``link`` receives up to and including the first message ``done`` accepts."""
    got: list[Incoming] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = link.receive(deadline - time.monotonic())
        if item is None:
            break
        got.append(item)
        if done(item):
            return got
    raise AssertionError(f"not received within {timeout} s; got {[m.topic for m in got]}")


def until_delivered(publisher: MqttLink, subscriber: MqttLink, topic: str, timeout: float = 10.0) -> None:
    """Publish probes on ``topic`` until ``subscriber`` gets one: its subscriptions are active."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        publisher.publish(topic, b"probe", wait=5)
        item = subscriber.receive(0.3)
        while item is not None:
            if item.topic == topic and item.payload == b"probe":
                while subscriber.receive(0.2) is not None:  # later probes
                    pass
                return
            item = subscriber.receive(0.05)
    raise AssertionError(f"{topic} never reached the subscriber")


def frame(kind: FrameKind, sender: str) -> bytes:
    """A real frame of ``kind`` carrying absurd weights, as an attacker would send."""
    extra = FrameExtra(task_id="t1", position=0) if kind != "artifact" else FrameExtra()
    if kind == "model":
        extra = FrameExtra(task_id="t1")
    weights = np.full(8, 1e9, np.float32)
    return next(encode_frames(weights, kind=kind, run=RUN, round=1, group=0, sender=sender, extra=extra))


def message(body: object, sender: str) -> bytes:
    return Message.of(body, run=RUN, sender=sender, round=1).encode()


def test_a_device_connects_over_tls_by_ip_and_registers(site_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from covey.paths import ensure_model
    from server.coordinator.config import CoordinatorConfig
    from server.coordinator.coordinator import Coordinator
    from server.fleet import leaf_writers, start_fleet
    from server.strategies import make_strategy
    from tests.mqtt.conftest import femnist_root

    # Prepare: the bundle dials the broker's IP, which only the certificate's IP SAN covers
    broker: SiteBroker = site_broker("pi-1")
    bundle = broker.site.layout.bundle("pi-1")
    toml = bundle / "device.toml"
    toml.write_text(toml.read_text().replace('broker = "localhost:', 'broker = "127.0.0.1:'))
    assert f'broker = "127.0.0.1:{broker.port}"' in toml.read_text()
    coord = Coordinator(
        CoordinatorConfig(
            RUN,
            "127.0.0.1",
            broker.port,
            tmp_path / "state",
            username="coordinator",
            password=broker.password("coordinator"),
            tls=broker.tls("coordinator"),
        ),
        make_strategy("fedavg", clients_per_round=1),
        ensure_model("mlp_femnist"),
    )
    root = femnist_root()

    # Execute
    with start_fleet(root, leaf_writers(root, 1), run=RUN, host="", port=0, configs=[toml], log_dir=tmp_path):
        try:
            coord.connect()
            coord.wait_for_devices(1, timeout=60)
        finally:
            coord.stop_devices()
            coord.close()

    # Assert
    assert list(coord.devices) == ["pi-1"]
    assert "IP address mismatch" not in (tmp_path / "dev000.log").read_text()


# What d1 tries in other names, or on the server's topics: the broker must drop each.
def forbidden() -> dict[str, bytes]:
    result = TrainResult("t1", 10**9, 0.1, 1, 0, 0, (10**9,))
    return {
        T.results("d2"): message(result, "d2"),  # a result in d2's name
        T.uploads("d2"): frame("result", "d2"),  # d2's result frame
        T.register("d2"): message(Register(1, 0, (1,), "x", 0), "d2"),
        T.status("d2"): b"offline",
        T.handoff("d3", "d2"): frame("handoff", "d2"),  # a hand-off to d3 in d2's name
        T.handoff("d3", "server"): frame("handoff", "server"),  # ... or in the server's
        T.inbox("d2"): message(Stop("bye"), "server"),  # another device's inbox
        T.inbox("d1"): message(Stop("bye"), "server"),  # its own inbox is the server's to write
        T.frames("d2"): frame("model", "server"),
        T.assignment("d2"): b"{}",
        T.artifact_manifest: b"{}",
        T.artifact_chunk(0): frame("artifact", "server"),
        T.shared_chunk("k", 0): frame("model", "server"),
        T.server_status: b"{}",
        Topics("otherrun").results("d2"): message(result, "d2"),  # another run, same rule
    }


def test_a_device_cannot_publish_in_another_name_nor_on_the_servers_topics(site_broker) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the observer is the coordinator, which may read everything
    broker: SiteBroker = site_broker("d1", "d2", "d3")
    observer = broker.connected("coordinator")
    observer.subscribe("covey/#")
    d1 = broker.connected("d1")
    until_delivered(d1, observer, T.results("d1"))

    # Execute
    for topic, payload in forbidden().items():
        d1.publish(topic, payload, wait=5)  # acknowledged: MQTT 3.1.1 cannot say "denied"
    own_handoff = frame("handoff", "d1")
    d1.publish(T.handoff("d3", "d1"), own_handoff, wait=5)  # a hand-off in its own name is allowed
    d1.publish(T.results("d1"), b"marker", wait=5)
    got = drain_until(observer, lambda m: m.payload == b"marker")

    # Assert: only the allowed publishes arrived, in order
    assert [(m.topic, m.payload) for m in got] == [(T.handoff("d3", "d1"), own_handoff), (T.results("d1"), b"marker")]


def test_a_device_cannot_read_another_devices_inbox(site_broker) -> None:  # type: ignore[no-untyped-def]
    # Prepare: d2 asks for d3's inbox, every inbox and everything, besides its own
    broker: SiteBroker = site_broker("d1", "d2", "d3")
    server = broker.connected("coordinator")
    d2 = broker.connected("d2")
    d2.subscribe(T.inbox("d3"), f"{T.root}/device/+/inbox", "covey/#", T.inbox("d2"))
    until_delivered(server, d2, T.inbox("d2"))

    # Execute
    server.publish(T.inbox("d3"), message(Stop("for d3 only"), "server"), wait=5)
    server.publish(T.frames("d3"), frame("model", "server"), wait=5)
    server.publish(T.results("d1"), b"d1's result", wait=5)
    server.publish(T.artifact_manifest, b"{}", wait=5)  # what every device may read
    server.publish(T.inbox("d2"), b"marker", wait=5)
    got = drain_until(d2, lambda m: m.payload == b"marker")

    # Assert: the denied subscriptions delivered nothing; only the artifact and d2's own inbox
    assert {m.topic for m in got} == {T.artifact_manifest, T.inbox("d2")}


@pytest.mark.parametrize(
    ("user", "password", "other_ca", "host", "needles"),
    [
        (None, None, False, "127.0.0.1", ["refused", "Not authorized"]),
        ("d1", "not-the-password", False, "127.0.0.1", ["refused", "Not authorized", "password"]),
        ("d1", None, True, "127.0.0.1", ["TLS", "certificate", "ca_certs"]),
        ("d1", None, False, "127.0.0.2", ["TLS", "IP address mismatch"]),  # an address not in the SANs
    ],
    ids=["no-credentials", "wrong-password", "unknown-ca", "address-not-in-certificate"],
)
def test_a_connection_without_valid_credentials_or_ca_is_refused(  # type: ignore[no-untyped-def]
    site_broker, site_parent: Path, user, password, other_ca, host, needles
) -> None:
    # Prepare
    broker: SiteBroker = site_broker("d1")
    ca = None
    if other_ca:
        ca = site_parent / "other-ca.crt"
        ca.write_bytes(make_ca("elsewhere").cert_pem)
    link = broker.link(user, password=password, ca=ca, host=host)
    if user is None:
        link = MqttLink("anonymous", host, broker.port, tls=broker.tls(None, ca))

    # Execute
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        link.connect(10)

    # Assert: a clear reason, at once rather than at the timeout
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert time.monotonic() - started < 5


def test_a_client_reusing_the_coordinators_client_id_does_not_kick_it(site_broker) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the coordinator and d2 with their usual client ids
    broker: SiteBroker = site_broker("d1", "d2")
    coordinator = broker.connected("coordinator", client_id=f"covey-{RUN}-server")
    coordinator.subscribe("covey/#")
    d2 = broker.connected("d2", client_id=f"covey-{RUN}-d2")
    until_delivered(d2, coordinator, T.results("d2"))

    # Execute: d1 connects with the coordinator's client id, its user name, and d2's id
    for client_id in (f"covey-{RUN}-server", "coordinator", f"covey-{RUN}-d2"):
        attacker = broker.link("d1", client_id=client_id)
        attacker.connect(10)
        attacker.publish(T.results("d1"), client_id.encode(), wait=5)
        attacker.close()
    drain_until(coordinator, lambda m: m.payload == f"covey-{RUN}-d2".encode())

    # Assert: the coordinator and d2 kept their connections throughout
    assert coordinator.connected and coordinator.disconnects == 0
    assert d2.connected and d2.disconnects == 0


def test_without_username_as_clientid_the_same_client_id_would_kick_the_coordinator(site_broker) -> None:  # type: ignore[no-untyped-def]
    """The control of the test above: the same steps against the config without
    ``use_username_as_clientid`` show that a kick is seen when it happens."""
    # Prepare
    broker: SiteBroker = site_broker("d1")
    broker.handle.stop()
    conf = broker.site.layout.broker_conf
    conf.write_text(conf.read_text().replace("use_username_as_clientid true", ""))
    from server.broker import run_mosquitto

    broker.handle = run_mosquitto(conf, "127.0.0.1", broker.port, log=conf.with_name("control.log"))
    coordinator = broker.connected("coordinator", client_id=f"covey-{RUN}-server")

    # Execute
    broker.connected("d1", client_id=f"covey-{RUN}-server")

    # Assert
    deadline = time.monotonic() + 10
    while coordinator.disconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert coordinator.disconnects >= 1


def test_with_client_certs_a_device_needs_its_certificate_as_well(site_broker) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    broker: SiteBroker = site_broker("d1", extra=("--client-certs",))
    assert (broker.folder("d1") / "client.crt").exists() and (broker.folder("coordinator") / "client.crt").exists()

    # Execute
    with_cert = broker.connected("d1")
    without = MqttLink(
        "no-cert", "127.0.0.1", broker.port, username="d1", password=broker.password("d1"), tls=broker.tls(None)
    )
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        without.connect(10)

    # Assert: refused at once, and the reason names the certificate
    assert with_cert.connected
    assert "client certificate" in str(info.value) and time.monotonic() - started < 5
