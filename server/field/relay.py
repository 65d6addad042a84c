"""A userspace TCP relay that gives a link latency, jitter, loss and outages.

``netem`` is not available on the machines covey is developed on; ``tbf``/``htb`` are
(bandwidth: :meth:`server.field.netns.Lab.shape`). The rest of a link's character comes
from this relay, which an agent dials instead of the broker (inside its network
namespace, on loopback) and which forwards to the broker:

* **latency**: every chunk read in one direction is written ``latency_ms`` later (plus a
  uniform ``jitter_ms``), in order: a chunk never overtakes the one before it;
* **loss**: a stream cannot lose bytes, TCP retransmits them; so a lost segment is a
  chunk held back one retransmission timeout (``rto_ms``, Linux's 200 ms minimum), with
  probability ``loss`` per chunk;
* **bandwidth**: with ``rate_mbit``, each direction is one first-in first-out link of
  that rate shared by every connection through the relay (a site's uplink that all its
  boards' connections cross): a chunk leaves once the chunks read before it, on any
  connection, have been sent, then takes ``latency_ms``;
* **outage**: :meth:`Relay.outage` (or ``SIGUSR1`` to ``python -m server.field.relay``)
  closes every connection and refuses new ones for ``outage_s`` seconds, as a board
  that walks out of range.

The relay is told nothing about covey and covey nothing about the relay: what grouping
sees of these links is what it measures (docs/links.md).

Usage: ``python -m server.field.relay --listen 127.0.0.1:1883 --to 10.77.0.1:1883
[--latency-ms 30] [--jitter-ms 5] [--loss 0.01] [--outage-s 10] [--seed 0]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("covey.field")
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Impairment:
    """What the relay does to each direction of every connection."""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rto_ms: float = 200.0
    rate_mbit: float | None = None  # each direction's bandwidth, shared by every connection

    def __post_init__(self) -> None:
        if self.latency_ms < 0 or self.jitter_ms < 0 or self.rto_ms < 0:
            raise ValueError("latency, jitter and rto must be >= 0 ms")
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ValueError(f"rate must be above 0 Mbit/s, got {self.rate_mbit}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss must be a fraction in [0, 1), got {self.loss}")


def _split(spec: str) -> tuple[str, int]:
    host, _, port = spec.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {spec!r}")
    return host, int(port)


class Relay:
    """One listening address forwarding to ``target`` with ``impairment`` (see module)."""

    def __init__(
        self,
        listen: tuple[str, int],
        target: tuple[str, int],
        impairment: Impairment | None = None,
        *,
        seed: int = 0,
    ) -> None:
        self.listen, self.target = listen, target
        self.impairment = impairment or Impairment()
        self.rng = np.random.default_rng(seed)
        self.port = listen[1]
        self.connections = 0  # accepted so far
        # bytes carried towards the target ("up") and back ("down"), every connection
        self.carried = {"up": 0, "down": 0}
        self._free_at = {"up": 0.0, "down": 0.0}  # when each direction's link is next idle
        self._down_until = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # -- control (any thread) ---------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> Relay:
        """Serve in a background thread; returns once listening (``port`` is then bound)."""
        self._thread = threading.Thread(target=self._run, name="covey-relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the relay did not start listening on {self.listen} within {timeout} s")
        return self

    def outage(self, seconds: float, *, stop_listening: bool = False) -> None:
        """Cut every connection now and refuse new ones for ``seconds``: each is accepted
        and closed at once (a board out of range), or with ``stop_listening`` not accepted
        at all (connection refused, as a gateway whose uplink is down answers).
        mosquitto 2.0.11's TLS bridge spun at 100 % CPU on a handshake closed under it,
        so cut bridges with ``stop_listening``."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._cut, seconds, stop_listening)

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._server = loop.run_until_complete(asyncio.start_server(self._accept, *self.listen))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for w in list(self._writers):
                w.close()
            tasks = asyncio.all_tasks(loop)
            for t in tasks:  # every connection's pipes end here, not half-run at interpreter exit
                t.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            with contextlib.suppress(Exception):
                loop.run_until_complete(self._server.wait_closed())
            loop.close()

    def _cut(self, seconds: float, stop_listening: bool = False) -> None:
        self._down_until = time.monotonic() + seconds
        log.info("relay %s: outage for %.1f s (%d connections cut)", self.port, seconds, len(self._writers))
        for w in list(self._writers):
            w.close()
        if stop_listening and self._server is not None and self._loop is not None:
            self._server.close()
            self._loop.call_later(seconds, lambda: asyncio.ensure_future(self._listen_again()))

    async def _listen_again(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._down_until:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.warning("relay %s: cannot reach %s:%s (%s)", self.port, *self.target, exc)
            writer.close()
            return
        if time.monotonic() < self._down_until:  # an outage began while it dialled the target
            writer.close()
            up_writer.close()
            return
        self.connections += 1
        self._writers.update((writer, up_writer))
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer, "up")),
            asyncio.ensure_future(self._pipe(up_reader, writer, "down")),
        ]
        try:
            # a direction that fails (a reset) ends the connection both ways, as on a real link
            done, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() is not None for t in done if not t.cancelled()):
                for t in pending:
                    t.cancel()
            else:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    def _delay_s(self) -> float:
        imp = self.impairment
        delay = imp.latency_ms + (self.rng.uniform(0, imp.jitter_ms) if imp.jitter_ms else 0.0)
        if imp.loss and self.rng.random() < imp.loss:
            delay += imp.rto_ms  # a lost segment: the stream waits for its retransmission
        return delay / 1000.0

    def _sent_at(self, direction: str, nbytes: int) -> float:
        """When a chunk of ``nbytes`` read now has crossed ``direction``'s link (now, if
        the relay has no rate): after what was read before it, at the link's rate."""
        now, rate = time.monotonic(), self.impairment.rate_mbit
        self.carried[direction] += nbytes
        if rate is None:
            return now
        done = max(now, self._free_at[direction]) + nbytes * 8 / (rate * 1e6)
        self._free_at[direction] = done
        return done

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """Copy one direction, each chunk ``_delay_s`` after it crossed the link, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=64)  # 4 MiB in flight: backpressure

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError):
                writer.write_eof()

        sender = asyncio.ensure_future(deliver())
        last = 0.0
        try:
            while True:
                data = await reader.read(CHUNK)
                # never overtakes the chunk before
                last = max(last, self._sent_at(direction, len(data)) + self._delay_s())
                put = asyncio.ensure_future(queue.put((last, data)))
                await asyncio.wait({put, sender}, return_when=asyncio.FIRST_COMPLETED)
                if sender.done() and not put.done():  # the far side failed: nothing will drain the queue
                    put.cancel()
                    sender.result()  # its error ends this direction, and the connection with it
                    return
                if not data:
                    break
            await sender
        finally:
            if not sender.done():
                sender.cancel()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="HOST:PORT to accept on (an agent dials this)")
    p.add_argument("--to", required=True, help="HOST:PORT to forward to (the broker)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="one-way delay added to each direction")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="uniform extra delay, 0..J ms")
    p.add_argument("--loss", type=float, default=0.0, help="chance per chunk of a retransmission wait (rto)")
    p.add_argument("--rate-mbit", type=float, help="each direction's bandwidth, shared by all connections")
    p.add_argument("--outage-s", type=float, default=10.0, help="length of an outage SIGUSR1 starts")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        relay = Relay(
            _split(args.listen),
            _split(args.to),
            Impairment(args.latency_ms, args.jitter_ms, args.loss, rate_mbit=args.rate_mbit),
            seed=args.seed,
        )
    except ValueError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    relay.start()
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: relay.outage(args.outage_s))
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"relay listening on {args.listen.rpartition(':')[0]}:{relay.port} -> {args.to}", flush=True)
    while not stop.wait(1.0):
        pass
    relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
