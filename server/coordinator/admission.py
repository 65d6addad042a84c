"""Admission control: which registrations become devices of the run, and how fast.

A registration from an id the registry does not know goes through, in order:

1. the *allowlist* (a site run passes the provisioned ids): any other id is refused;
2. the *cap*: at most ``max_devices`` devices, confirmed and pending together;
3. *confirmation*: the registration waits (``pending``) until the device answers a
   ``ping`` the coordinator sends to its inbox, echoing that ping's time exactly.
   Only then is it a device that rounds may sample. A flood of registrations from
   ids that no agent serves therefore never reaches a strategy, and the ping's answer
   gives the device's RTT for free;
4. the *rate*: confirmation pings leave at most ``rate`` per second (a token bucket
   of depth ``burst``; Turner, "New directions in communications", 1986, the single
   rate meter of RFC 2697), so a flood cannot make the coordinator flood the broker.
   A registration that waits is not refused: it is pinged when a token is free.

The pending queue holds at most ``max_pending`` registrations; beyond that the oldest
is evicted (a legitimate device then stays out until it registers again: use an
allowlist when that matters). With an allowlist the queue holds the whole list: only
listed ids can queue, so it cannot be flooded, and a site whose boards all start at
once (power back after an outage) must not push its own boards out. A pending device is pinged again every ``repeat_s``
seconds. Re-registrations of known devices (new counts, a new coordinator epoch)
skip all of this. Every refusal and eviction is counted by reason (``counts``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from device.errors import ProtocolError
from device.protocol import Register

Clock = Callable[[], float]


class AdmissionError(ProtocolError):
    """A registration admission control refused; ``reason`` names the rule."""

    def __init__(self, device: str, reason: str) -> None:
        super().__init__(f"registration of {device!r} refused: {reason}")
        self.reason = f"registration refused: {reason}"


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up (starts full)."""

    def __init__(self, rate: float, burst: float, clock: Clock = time.monotonic) -> None:
        if not rate > 0 or not burst >= 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        self.tokens, self.stamp = float(burst), clock()

    def take(self) -> bool:
        """Take one token if there is one."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class Pending:
    body: Register
    since: float
    ping_t: float | None = None  # the ``t`` of the last ping sent (its pong must echo it)
    pinged_at: float = float("-inf")


class Admission:
    """The rules above; the registry asks it about every new id.

    Parameters
    ----------
    allowed : the provisioned ids (``None``: an open run, anyone may register).
    max_devices : confirmed plus pending devices at most.
    rate, burst : confirmation pings per second, and how many may leave at once.
    max_pending : registrations waiting for their ping's answer at most (at least the
        allowlist's length when there is one).
    repeat_s : a pending device is pinged again after this many seconds.
    """

    def __init__(
        self,
        *,
        allowed: frozenset[str] | None = None,
        max_devices: int = 1000,
        rate: float = 20.0,
        burst: float = 100.0,
        max_pending: int = 256,
        repeat_s: float = 10.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if max_devices < 1 or max_pending < 1 or not repeat_s > 0:
            raise ValueError("max_devices and max_pending must be at least 1 and repeat_s positive")
        self.allowed = allowed
        if allowed is not None:
            max_pending = max(max_pending, len(allowed))
        self.max_devices, self.max_pending, self.repeat_s = max_devices, max_pending, repeat_s
        self.bucket = TokenBucket(rate, burst, clock)
        self.clock = clock
        self.pending: OrderedDict[str, Pending] = OrderedDict()
        self.counts: dict[str, int] = {}  # reason -> registrations refused or evicted, over the run

    def _count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def request(self, device: str, body: Register, n_confirmed: int) -> list[str]:
        """A registration from an id that is not a confirmed device. Raises
        :class:`AdmissionError`; otherwise the registration waits for its ping, and
        the ids evicted to make room are returned (they were counted)."""
        if self.allowed is not None and device not in self.allowed:
            self._count("not on the allowlist")
            raise AdmissionError(device, "not on the allowlist")
        if device in self.pending:  # registered again before answering: keep its place
            self.pending[device].body = body
            return []
        if n_confirmed + len(self.pending) >= self.max_devices:
            self._count("the run is full")
            raise AdmissionError(device, f"the run is full ({self.max_devices} devices)")
        evicted = []
        while len(self.pending) >= self.max_pending:
            oldest, _ = self.pending.popitem(last=False)
            evicted.append(oldest)
            self._count("evicted before confirming")
        self.pending[device] = Pending(body, self.clock())
        return evicted

    def pings_due(self) -> list[tuple[str, float]]:
        """``(device, t)`` of the confirmation pings to send now (as tokens allow)."""
        now = self.clock()
        due = []
        for device, p in self.pending.items():
            if now - p.pinged_at < self.repeat_s:
                continue
            if not self.bucket.take():
                break
            p.pinged_at, p.ping_t = now, time.time()
            due.append((device, p.ping_t))
        return due

    def confirm(self, device: str, echo: float) -> Register | None:
        """The registration ``device`` confirmed by a pong echoing its ping, else None."""
        p = self.pending.get(device)
        if p is None or p.ping_t is None or echo != p.ping_t:
            return None
        del self.pending[device]
        return p.body
