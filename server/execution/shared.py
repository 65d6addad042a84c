"""Shared models: one retained copy on the broker instead of one copy per device.

When many devices start from the same model (the members of a parallel group, every
device asked to pre-train or to evaluate), the coordinator publishes the model once,
retained, on ``shared/<key>/chunk/<i>``; each request names the key, and the device
subscribes to it on receipt and gets the retained frames from the broker. The broker
fans the bytes out in C, so the coordinator's upload no longer grows with the number
of devices: with 50 devices and the 26 MB FEMNIST CNN, that is 26 MB sent once
instead of 1.3 GB pushed through one Python client (which is what stalled the
50-agent round of ``bench/transport.py``). Keys are cleared (an empty retained
message per chunk) as soon as the work that needed them is over, so the broker holds
no stale models.
"""

from __future__ import annotations

import itertools

import numpy as np

from device.protocol import SERVER_ID, FrameCodec, FrameExtra, Publish, Topics, send_model


class SharedModels:
    """Publishes and clears the retained shared models of one coordinator."""

    def __init__(self, topics: Topics, publish: Publish, max_chunk: int, token: str) -> None:
        self.topics, self._publish, self.max_chunk = topics, publish, max_chunk
        self._live: dict[str, int] = {}  # key -> number of retained chunks
        self._counter = itertools.count()
        # unique per coordinator process (its epoch): a restarted coordinator never
        # reuses a key a crashed one may have left retained on the broker
        self._token = token

    def publish(self, weights: np.ndarray, *, round_: int, group: int, label: str, codec: FrameCodec = "raw") -> str:
        """Publish ``weights`` (a payload encoded by ``codec``) once, retained; returns
        the key devices subscribe to."""
        key = f"r{int(round_)}-{label}-{self._token}{next(self._counter)}"
        self._live[key] = send_model(
            self._publish,
            lambda i: self.topics.shared_chunk(key, i),
            weights,
            kind="model",
            run=self.topics.run,
            round=round_,
            group=group,
            sender=SERVER_ID,
            max_chunk=self.max_chunk,
            extra=FrameExtra(shared=key),
            retain=True,
            codec=codec,
        )
        return key

    def clear(self, *keys: str) -> None:
        """Remove retained copies (all of them when no key is given)."""
        for key in keys or tuple(self._live):
            for i in range(self._live.pop(key, 0)):
                self._publish(self.topics.shared_chunk(key, i), b"", True)

    @property
    def live(self) -> tuple[str, ...]:
        return tuple(self._live)
