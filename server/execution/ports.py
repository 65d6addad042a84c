"""What plan execution needs from the world: a bus and a clock.

:class:`~server.execution.round.RoundExecution` sends through :attr:`ExecutionBus.publish`
and hears what devices send through its own ``on_result``/``on_frame``/``on_refused``,
called by the bus while it waits (:meth:`ExecutionBus.wait`). It reads the time from a
:data:`Clock`. So the same managers run on two buses:

* on boards, :class:`PolledBus` over the coordinator's receive loop (MQTT, the sender
  from the topic: ``server/coordinator/inbox.py``) and the wall clock;
* in simulation, :class:`~server.simulation.virtual_bus.VirtualBus`, which delivers
  each message to a virtual device running the board's task code, trains what is ready
  on the simulator's workers, and moves its own clock to the next deadline when
  nothing is left to do (a silent device costs no wall time).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from device.protocol import Publish

Clock = Callable[[], float]  # seconds, monotonic

POLL_S = 0.05  # at most this long between two looks at the managers' deadlines on boards


class ExecutionBus(Protocol):
    """How a round's execution talks to devices."""

    def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        """Send one message (a request, one frame of a model, a retained shared model)."""

    def wait(self, until: float) -> None:
        """Hand what devices sent to the execution, returning once something was handled
        or, at the latest, when the clock reads ``until`` (the managers' next deadline)."""


@dataclass(frozen=True)
class PolledBus:
    """A bus whose receive loop handles at most one message per call within a timeout
    (the coordinator's :meth:`~server.coordinator.inbox.Inbox.pump`), on the wall clock.

    Parameters
    ----------
    send : publishes one message.
    poll : handles at most one incoming message, waiting up to its argument in seconds.
    clock : the time the managers' deadlines are on.
    """

    send: Publish
    poll: Callable[[float], None]
    clock: Clock = time.monotonic

    def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        self.send(topic, payload, retain)

    def wait(self, until: float) -> None:
        self.poll(min(POLL_S, max(0.0, until - self.clock())))
