"""The one module that touches paho-mqtt: a small, blocking-with-timeouts link.

paho's callbacks run on its network thread. They never block here: an incoming
message is put on a bounded receive queue (:mod:`device.receive_queue`: bounded in
messages and bytes, and per *lane*; what does not fit is dropped and counted), and
connection changes set events. Every wait has a timeout. Sessions are persistent
(``clean_session=False``), QoS 1 throughout, and the last will marks the client
offline. paho reconnects on its own with exponential backoff (1 to 30 s), and
subscriptions are renewed on every connect.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as paho

from device.errors import ConfigError, TransportError
from device.receive_queue import Incoming, LaneOf, QueuedLink, ReceiveQueue

__all__ = ["Incoming", "LaneOf", "MqttLink", "ReceiveQueue", "TlsFiles", "Will"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsFiles:
    """TLS files: the broker's CA bundle (``None``: the system's trusted CAs) and an
    optional client certificate with its private key (the key may sit in ``certfile``)."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None


def _readable_file(path: str, name: str) -> None:
    """``path`` is a file this process can read, else ConfigError naming ``name``."""
    if not os.path.exists(path):
        raise ConfigError(f"{name} {path} does not exist; give the path of a PEM file")
    if not os.path.isfile(path):
        raise ConfigError(f"{name} {path} is not a file; give the path of a PEM file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{name} {path} cannot be read ({exc.strerror}); check its permissions") from None


def read_password_file(path: str, name: str = "password_file") -> str:
    """The broker password kept in ``path`` (its first line, without surrounding
    whitespace), else ConfigError naming ``name`` (a flag, or a config file and key)."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.readline().strip()
    except FileNotFoundError:
        raise ConfigError(f"{name} {path} does not exist; give the file that holds the broker password") from None
    except IsADirectoryError:
        raise ConfigError(f"{name} {path} is a folder; give the file that holds the broker password") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{name} {path} cannot be read ({reason}); check its permissions") from None
    if not text:
        raise ConfigError(f"{name} {path} is empty; give the file that holds the broker password")
    return text


def check_tls_files(tls: TlsFiles, names: dict[str, str] | None = None) -> None:
    """Load the TLS files the way the connection will, before anything connects.

    Raises :class:`ConfigError` naming the file (``names`` maps each field to what the
    user called it: a flag, or a config file and key) and what to do. A key protected
    by a passphrase is refused: an unattended agent has nobody to type it.
    """
    names = {"ca_certs": "ca_certs", "certfile": "certfile", "keyfile": "keyfile", **(names or {})}
    if tls.keyfile and not tls.certfile:
        raise ConfigError(f"{names['keyfile']} needs {names['certfile']}: give the client certificate too")
    for field in ("ca_certs", "certfile", "keyfile"):
        path = getattr(tls, field)
        if path is not None:
            _readable_file(path, names[field])
    try:
        context = ssl.create_default_context(cafile=tls.ca_certs)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{names['ca_certs']} {tls.ca_certs} holds no PEM certificate OpenSSL can load ({exc.reason or exc}); "
            "give the broker's CA certificate"
        ) from None
    if tls.certfile is None:
        return
    try:  # the certificate on its own, so that an error names the right file
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=tls.certfile)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{names['certfile']} {tls.certfile} holds no PEM certificate OpenSSL can load ({exc.reason or exc}); "
            "give the client certificate"
        ) from None
    asked: list[bool] = []

    def no_passphrase() -> bytes:
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(tls.certfile, tls.keyfile, password=no_passphrase)
    except ssl.SSLError as exc:
        key_name, key_path = (names["keyfile"], tls.keyfile) if tls.keyfile else (names["certfile"], tls.certfile)
        if asked:
            message = f"{key_name} {key_path} is protected by a passphrase; give the agent an unencrypted key"
        elif "MISMATCH" in str(exc.reason).upper():
            pair = f"and {names['keyfile']} {tls.keyfile} do not" if tls.keyfile else "holds a key that does not"
            message = f"{names['certfile']} {tls.certfile} {pair} match; give the private key of that certificate"
        else:
            message = (
                f"{key_name} {key_path} holds no PEM private key OpenSSL can load ({exc.reason or exc}); "
                f"give the client certificate's key{'' if tls.keyfile else ' (or add it to ' + names['certfile'] + ')'}"
            )
        raise ConfigError(message) from None


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    retain: bool = True


class MqttLink(QueuedLink):
    """A connected MQTT client with a receive queue."""

    def __init__(
        self,
        client_id: str,
        host: str,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: TlsFiles | None = None,
        will: Will | None = None,
        clean_session: bool = False,
        max_queue: int = 10_000,
        max_queue_bytes: int | None = None,
        lane_of: LaneOf | None = None,
        lane_max_messages: int = 2_000,
        lane_max_bytes: int | None = None,
        keepalive: int = 30,
    ) -> None:
        self.host, self.port, self.keepalive = host, port, keepalive
        self.client_id = client_id
        self._rx = ReceiveQueue(
            client_id,
            max_queue=max_queue,
            max_queue_bytes=max_queue_bytes,
            lane_of=lane_of,
            lane_max_messages=lane_max_messages,
            lane_max_bytes=lane_max_bytes,
        )
        self._connected = threading.Event()
        self._refused: str | None = None
        self.connections = 0  # successful connects so far: more than one means it reconnected
        self._refused_event = threading.Event()  # refused, or hung up on before any connection
        self.disconnects = 0  # connections lost (not closed by us): a client kicked by another counts here
        self._subscriptions: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        # SUBACKs by message id, newest last: whether the broker granted each topic. A
        # bounded record that only subscribe(wait=) reads; the ids it waits for stay.
        self._subacks: dict[int, tuple[bool, ...]] = {}
        self._awaited: set[int] = set()
        self._subacked = threading.Condition(threading.Lock())
        self._client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=paho.MQTTv311,
        )
        if username is not None:
            self._client.username_pw_set(username, password)
        if tls is not None:
            check_tls_files(tls)  # a ConfigError naming the file, not an ssl traceback from paho
            self._client.tls_set(ca_certs=tls.ca_certs, certfile=tls.certfile, keyfile=tls.keyfile)
        if will is not None:
            self._client.will_set(will.topic, will.payload, qos=1, retain=will.retain)
        self._client.reconnect_delay_set(min_delay=1, max_delay=30)
        self._client.max_inflight_messages_set(64)
        self._client.max_queued_messages_set(0)
        self._client.on_connect = self._on_connect
        self._client.on_socket_open = self._on_socket_open
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe

    # -- callbacks (network thread: never block) -----------------------------------------
    @staticmethod
    def _on_socket_open(client: paho.Client, userdata: object, sock: paho.SocketLike) -> None:
        """Small messages (requests, probes, acknowledgements) leave at once: without
        TCP_NODELAY, Nagle holds one until the previous segment's ACK, which the peer's
        delayed ACK keeps back up to 40 ms (the broker's config sets the same)."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[attr-defined]
        except (OSError, AttributeError, ValueError) as exc:  # a websocket or a non-TCP socket
            log.debug("no TCP_NODELAY on this connection (%s)", exc)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        if reason_code.is_failure:
            self._refused = str(reason_code)
            self._refused_event.set()
            return
        self._refused_event.clear()
        with self._lock:
            topics = list(self._subscriptions)
        for topic in topics:
            client.subscribe(topic, qos=1)
        self.connections += 1
        self._connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        self._connected.clear()
        if self.connections == 0 and not self._refused_event.is_set():
            # the broker hung up before its CONNACK: a TLS listener that wants a client
            # certificate does so after the handshake (TLS 1.3); connect() reports it
            self._refused = ""
            self._refused_event.set()
        if reason_code.is_failure and not self._refused_event.is_set():  # a refusal is connect()'s to report
            self.disconnects += 1
            log.warning("%s: lost the broker (%s); reconnecting", self.client_id, reason_code)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:  # type: ignore[no-untyped-def]
        with self._subacked:  # held by subscribe() only while it sends, never while it waits
            self._subacks.pop(mid, None)  # ids wrap at 65535: this one goes last
            self._subacks[mid] = tuple(not code.is_failure for code in reason_codes)
            for old in [m for m in self._subacks if m not in self._awaited][: max(0, len(self._subacks) - 256)]:
                del self._subacks[old]
            self._subacked.notify_all()

    def _on_message(self, client, userdata, msg) -> None:  # type: ignore[no-untyped-def]
        self._rx.offer(msg.topic, bytes(msg.payload), bool(msg.retain))

    # -- API ----------------------------------------------------------------------------
    def connect(self, timeout: float = 10.0) -> None:
        """Connect within ``timeout`` seconds, else :class:`TransportError` saying why: the
        broker unreachable, the TLS handshake failed (naming the certificate problem), or
        the broker refused the credentials (at once, without waiting for the timeout)."""
        try:
            self._client.connect(self.host, self.port, keepalive=self.keepalive)
        except ssl.SSLCertVerificationError as exc:
            why = str(exc.verify_message).rstrip(".")
            raise TransportError(
                f"TLS with the broker at {self.host}:{self.port} failed: {why}; give the CA that signed the "
                "broker's certificate (ca_certs) and dial a name or address the certificate holds"
            ) from None
        except ssl.SSLError as exc:
            raise TransportError(
                f"TLS with the broker at {self.host}:{self.port} failed ({exc.reason or exc}); is that port "
                "a TLS listener, and does the broker want a client certificate?"
            ) from None
        except OSError as exc:
            raise TransportError(
                f"cannot reach the broker at {self.host}:{self.port} ({exc.strerror or exc})"
            ) from None
        self._client.loop_start()
        deadline = time.monotonic() + timeout
        while not self._connected.wait(0.02):
            if self._refused_event.is_set() or time.monotonic() > deadline:
                self._client.loop_stop()
                break
        else:
            return
        if self._refused == "":
            raise TransportError(
                f"the broker at {self.host}:{self.port} closed the connection before accepting it; if it asks for "
                "a client certificate, give certfile and keyfile (its log says why)"
            )
        if self._refused is not None:
            raise TransportError(
                f"the broker at {self.host}:{self.port} refused the connection ({self._refused}); "
                "check the user name and password (or password_file)"
            )
        raise TransportError(f"no MQTT connection to {self.host}:{self.port} within {timeout:.0f} s")

    def subscribe(self, *topics: str, wait: float | None = None) -> None:
        """Subscribe to ``topics`` (QoS 1, one SUBSCRIBE), and again after every reconnect.

        With ``wait``: return once the broker confirmed them, so that what is published
        from then on reaches this link. Not connected, a refusal, or no answer within
        ``wait`` seconds is a :class:`TransportError` (the first forgets the topics; the
        others keep them for the next reconnect, which subscribes again: a reconnect
        while waiting also ends in no answer). Without ``wait``, no connection is no
        error: the topics are subscribed when the link (re)connects. mosquitto's ACL file never refuses a
        subscription: it grants it and withholds at delivery what the client may not
        read. Brokers that check ACLs at subscription answer 0x80, the refusal here."""
        if not topics:
            return
        with self._lock:
            added = set(topics) - self._subscriptions
            self._subscriptions.update(topics)
        # the network thread cannot record this SUBACK before its id is known and any
        # stale entry under that id is gone: it waits for this lock (paho's subscribe
        # takes none that the network thread holds while in a callback)
        with self._subacked:
            result, mid = self._client.subscribe([(topic, 1) for topic in topics])
            if result != paho.MQTT_ERR_SUCCESS or mid is None:
                if wait is None and result == paho.MQTT_ERR_NO_CONN:
                    return  # subscribed at the (re)connect
                if wait is not None:
                    with self._lock:
                        self._subscriptions.difference_update(added)
                raise TransportError(f"subscribing to {list(topics)} failed ({paho.error_string(result)})")
            if wait is None:
                return
            self._subacks.pop(mid, None)
            self._awaited.add(mid)
            try:
                if not self._subacked.wait_for(lambda: mid in self._subacks, timeout=wait):
                    why = f"the broker did not confirm the subscription to {list(topics)} within {wait:g} s"
                    raise TransportError(why)
                granted = self._subacks.pop(mid)
            finally:
                self._awaited.discard(mid)
        refused = [topic for topic, ok in zip(topics, granted, strict=False) if not ok]
        if refused or len(granted) != len(topics):
            raise TransportError(f"the broker refused the subscription to {refused or list(topics)} (check its ACL)")

    def unsubscribe(self, *topics: str) -> None:
        with self._lock:
            self._subscriptions.difference_update(topics)
        for topic in topics:
            self._client.unsubscribe(topic)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False, wait: float | None = None) -> None:
        """Queue a QoS-1 message; with ``wait`` block until the broker acknowledged it."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc not in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN):
            raise TransportError(f"publish to {topic} failed ({paho.error_string(info.rc)})")
        if wait is not None:
            if info.rc == paho.MQTT_ERR_NO_CONN:
                # paho queued it for the next connection but cannot report that ack
                # (its is_published() raises RuntimeError): say so as covey's error.
                raise TransportError(
                    f"publish to {topic} not acknowledged: not connected to the broker at {self.host}:{self.port}"
                )
            deadline = time.monotonic() + wait
            while not info.is_published():
                if time.monotonic() > deadline:
                    raise TransportError(f"publish to {topic} not acknowledged within {wait:.0f} s")
                time.sleep(0.001)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def close(self) -> None:
        """Disconnect and stop the network thread. Never raises, in any state: never
        connected, connection lost (broker gone, paho retrying), or already closed.
        Stopping a device must always work; there is nothing left to do on failure."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client.disconnect()
        except Exception as exc:  # nothing to undo; the loop still has to stop
            log.debug("%s: disconnect while closing: %s", self.client_id, exc)
        try:
            self._client.loop_stop()
        except Exception as exc:
            log.debug("%s: stopping the network loop while closing: %s", self.client_id, exc)
        self._connected.clear()
