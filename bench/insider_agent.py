"""covey's agent as a dishonest board with valid credentials: it takes part in the run
and, once registered, attacks with its own broker identity.

``COVEY_INSIDER_ATTACKS`` (comma-separated) picks the attacks; ``COVEY_INSIDER_PEERS``
names the other boards:

* ``flood``: 16-byte junk frames at every peer's hand-off topic, as fast as the link takes;
* ``bigframes``: 16 MiB frames at every peer's hand-off topic and at its own upload topic;
* ``hoard``: first halves of 4,000 model-sized payloads that never complete (3.4 GB held if kept);
* ``retained``: retained junk under its own topics and on hand-off topics of made-up ids;
* ``nan``: every trained model it sends is NaN (``tests/mqtt/poisoning_agent.py``).

Run like covey-device (``server/fleet.py`` ``scripts``), with the repository on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import numpy as np

from device import agent as agent_module
from device import cli
from device.errors import CoveyError
from device.protocol import FrameExtra, encode_frames

ATTACKS = {a for a in os.environ.get("COVEY_INSIDER_ATTACKS", "").split(",") if a}
N_PARAMS = int(os.environ.get("COVEY_INSIDER_N_PARAMS", "433726"))  # the FEMNIST MLP's
PEERS = [p for p in os.environ.get("COVEY_INSIDER_PEERS", "").split(",") if p]
if "nan" in ATTACKS:
    os.environ["COVEY_POISON_SCALE"] = "nan"
    import tests.mqtt.poisoning_agent  # noqa: F401  (patches the runner: NaN models)


def _partial(me: str, run: str, i: int, n_params: int) -> bytes:
    """The first of the two chunks of a model-sized payload (its second never comes)."""
    frames = encode_frames(
        np.full(n_params, i, np.float32),
        kind="handoff",
        run=run,
        round=1,
        group=0,
        sender=me,
        extra=FrameExtra(f"hoard-{i}", position=0),
        max_chunk=(4 * n_params) // 2 + 1,
    )
    return next(iter(frames))


def _attack(agent: Any) -> None:
    link, t, me, run = agent.link, agent.topics, agent.me, agent.cfg.run
    rng = np.random.default_rng(0)
    big = bytes(16 * 2**20)
    junk = bytes(16)
    retained_junk = rng.bytes(900_000)
    hoarded = 0
    rounds = 0
    while agent.running:
        rounds += 1
        try:
            if "flood" in ATTACKS:
                for _ in range(200):
                    for peer in PEERS:
                        link.publish(t.handoff(peer, me), junk)
            if "bigframes" in ATTACKS and rounds % 20 == 1:
                for topic in [*(t.handoff(peer, me) for peer in PEERS), t.uploads(me)]:
                    link.publish(topic, big)
            if "hoard" in ATTACKS and hoarded < 4_000:
                for _ in range(50):
                    frame = _partial(me, run, hoarded, N_PARAMS)
                    link.publish(t.uploads(me), frame)
                    for peer in PEERS:
                        link.publish(t.handoff(peer, me), frame)
                    hoarded += 1
            if "retained" in ATTACKS and rounds % 10 == 1:
                link.publish(t.uploads(me), retained_junk, retain=True)
                link.publish(t.register(me), retained_junk, retain=True)
                for i in range(5):
                    link.publish(t.handoff(f"ghost{rounds}x{i}", me), retained_junk, retain=True)
        except CoveyError:
            pass  # disconnected by the broker (its packet limit): paho reconnects
        time.sleep(0.05)


_register = agent_module.Agent._register


def _register_then_attack(self: Any, *args: Any, **kwargs: Any) -> None:
    """Register as an honest board first (an insider holds its place in the run), then attack."""
    _register(self, *args, **kwargs)
    if ATTACKS - {"nan"} and not getattr(self, "_attacking", False):
        self._attacking = True
        threading.Thread(target=_attack, args=(self,), daemon=True).start()


agent_module.Agent._register = _register_then_attack  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
