"""The live page's server: a read-only HTTP endpoint beside the coordinator.

State reaches the page as server-sent events (``GET /events``): one ``data:`` line of
the page's JSON state (:mod:`server.dashboard.state`) whenever it changes, and a
comment every 15 s to keep proxies from closing the stream. Why SSE: the page only
listens (no control actions, so nothing flows back), every browser reconnects an
``EventSource`` by itself, and Python's standard library serves it; WebSocket would
need a library and a handshake for a one-way stream, and MQTT over WebSocket would
give a browser on the site's network a broker account and an ACL to keep right.

The coordinator's thread publishes (:meth:`LiveView.publish`); the HTTP threads only
read. Loopback by default; on any other address every request needs the token printed
at start (``?token=``), compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from device.errors import ConfigError
from server.dashboard.page import STATIC, live_page

log = logging.getLogger("covey.dashboard")
KEEPALIVE_S = 15.0
MAX_STREAMS = 32  # open pages at once; more get 503 (each holds a thread and a socket)
REQUEST_TIMEOUT_S = 10.0  # a client that sends nothing is dropped, not waited for
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


class LiveView:
    """The latest page state, its version, and a condition to wait for the next."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._text = "{}"
        self.version = 0
        self.closed = False
        self.listeners = 0  # open event streams (a feed may skip work when there are none)

    def publish(self, state: Mapping[str, Any]) -> None:
        """Set the state (a change wakes every stream; the same state again does not)."""
        text = json.dumps(state, allow_nan=False, separators=(",", ":"))
        with self._cond:
            if text != self._text:
                self._text = text
                self.version += 1
                self._cond.notify_all()

    def current(self) -> tuple[int, str]:
        with self._cond:
            return self.version, self._text

    def wait_newer(self, version: int, timeout: float) -> tuple[int, str]:
        """The state once its version passes ``version`` (or the view closes), or the
        current one after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != version or self.closed, timeout)
            return self.version, self._text

    def close(self) -> None:
        """Wake and end every stream."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def keep_url(path: Path, url: str) -> None:
    """Write the page's address (with its token) where only this user can read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(url + "\n")
    os.chmod(path, 0o600)


def parse_address(text: str) -> Address:
    """``[HOST:]PORT`` (host 127.0.0.1 by default); a mistake is one clear error."""
    if "/" in text:
        raise ConfigError(f"--dashboard takes [HOST:]PORT, not an address to open, got {text!r} (e.g. 0.0.0.0:8080)")
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"--dashboard takes [HOST:]PORT, got {text!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"--dashboard port must be 0-65535, got {number}")
    return Address(host, number)


class DashboardServer:
    """Serves the page, its scripts and the state stream of one :class:`LiveView`.

    Parameters
    ----------
    view : what to show.
    address : where to listen; port 0 picks a free one (:attr:`url` says which).
    title : the page's title.
    token : required on a non-loopback address (one is made when ``None``).
    """

    def __init__(self, view: LiveView, address: Address, title: str, token: str | None = None) -> None:
        self.view, self.title = view, title
        self.token = None if address.loopback else (token or secrets.token_urlsafe(18))
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("dashboard: %s", (format % args).split("token=")[0])  # never the token

            def do_GET(self) -> None:
                server.handle(self)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET

        self.streams = threading.BoundedSemaphore(MAX_STREAMS)
        try:
            self.httpd = Server((address.host, address.port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve the dashboard on {address.host}:{address.port}: {exc.strerror}") from None
        self.httpd.daemon_threads = True
        self.address = Address(address.host, self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="dashboard", daemon=True)

    @property
    def url(self) -> str:
        """Where to open the page: on every interface (0.0.0.0), at this machine's LAN
        address, which another laptop on the site can reach."""
        from server.broker import advertised_host

        reachable = advertised_host(self.address.host)
        host = f"[{reachable}]" if ":" in reachable else reachable
        query = f"?token={self.token}" if self.token else ""
        return f"http://{host}:{self.address.port}/{query}"

    def start(self) -> DashboardServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        self.view.close()  # wake the streams so they end
        if self.thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    # -- requests -------------------------------------------------------------------------
    def _allowed(self, query: Mapping[str, list[str]]) -> bool:
        if self.token is None:
            return True
        given = (query.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _host_allowed(self, req: BaseHTTPRequestHandler) -> bool:
        """On loopback, only a loopback ``Host``: a web page the operator visits cannot
        rebind its own name to 127.0.0.1 and read the run (DNS rebinding)."""
        if self.token is not None:
            return True  # off loopback the token guards every request
        host = (req.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        query = parse_qs(parts.query)
        if not self._host_allowed(req):
            self._send(req, HTTPStatus.FORBIDDEN, "text/plain; charset=utf-8", b"open the page by a loopback address\n")
            return
        if parts.path.startswith("/static/"):  # covey's own scripts and styles: public, no token
            self._static(req, parts.path.removeprefix("/static/"))
            return
        if not self._allowed(query):
            self._send(req, HTTPStatus.FORBIDDEN, "text/plain; charset=utf-8", b"a token is needed (?token=...)\n")
            return
        if parts.path == "/":
            body = live_page(self.title).encode()
            self._send(req, HTTPStatus.OK, "text/html; charset=utf-8", body)
        elif parts.path == "/state":
            self._send(req, HTTPStatus.OK, "application/json", self.view.current()[1].encode())
        elif parts.path == "/events":
            self._stream(req)
        else:
            self._send(req, HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n")

    def _static(self, req: BaseHTTPRequestHandler, name: str) -> None:
        path = (STATIC / name).resolve()
        if STATIC.resolve() not in path.parents or path.suffix not in STATIC_TYPES or not path.is_file():
            self._send(req, HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n")
            return
        self._send(req, HTTPStatus.OK, STATIC_TYPES[path.suffix], Path(path).read_bytes(), cache=True)

    def _send(
        self, req: BaseHTTPRequestHandler, status: HTTPStatus, kind: str, body: bytes, *, cache: bool = False
    ) -> None:
        req.send_response(status)
        req.send_header("Content-Type", kind)
        req.send_header("Content-Length", str(len(body)))
        req.send_header("X-Content-Type-Options", "nosniff")
        req.send_header("Content-Security-Policy", CSP)
        req.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        req.send_header("Referrer-Policy", "no-referrer")
        req.end_headers()
        try:
            req.wfile.write(body)
        except OSError:  # the client went away
            return

    def _stream(self, req: BaseHTTPRequestHandler) -> None:
        if not self.streams.acquire(blocking=False):
            body = f"at most {MAX_STREAMS} pages at once; close one\n".encode()
            self._send(req, HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", body)
            return
        with self.view._cond:
            self.view.listeners += 1
        try:
            req.send_response(HTTPStatus.OK)
            req.send_header("Content-Type", "text/event-stream")
            req.send_header("Cache-Control", "no-store")
            req.send_header("Referrer-Policy", "no-referrer")
            req.end_headers()
            version, text = self.view.current()
            req.wfile.write(f"data: {text}\n\n".encode())
            req.wfile.flush()
            while True:
                newer, text = self.view.wait_newer(version, KEEPALIVE_S)
                stopping = self.stopping.is_set()
                if newer != version:  # also the last state, published just before the server closed
                    req.wfile.write(f"data: {text}\n\n".encode())
                elif not stopping:
                    req.wfile.write(b": keep-alive\n\n")
                req.wfile.flush()
                version = newer
                if stopping:
                    break
        except OSError:  # the page closed, or its connection failed
            return
        finally:
            with self.view._cond:
                self.view.listeners -= 1
            self.streams.release()


# scripts and styles from this server only; no inline script, no eval, nothing remote
CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:"
