"""Misbehaving virtual devices, injected on purpose to test and measure robustness.

* ``unresponsive``: devices that never answer, like a board that is switched off.
  A parallel member is skipped; a chain goes on without it from the last good model
  (as the coordinator's group manager does, FedGSP Sec. 3.2); pre-training and
  evaluation requests get no reply from it.
* ``scale``: model poisoners. Device ``c`` returns ``start + scale[c] (trained -
  start)`` instead of its trained model: its honest update boosted by a factor, the
  "explicit boosting" of Bhagoji et al. (ICML 2019), which model-replacement attacks
  use (Bagdasaryan et al., AISTATS 2020). Its pre-training update is scaled alike.
* ``claims``: devices that lie about their sample count, in their registration and in
  every result (a count is an averaging weight in FedAvg's mean).
* ``direction``: devices that return a random direction at the norm of their honest
  update (so a norm bound cannot tell them apart), drawn from a generator seeded by
  the device and the round.

Boards get the same treatment from ``tests/mqtt/poisoning_agent.py``.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Faults:
    unresponsive: frozenset[str] = frozenset()
    scale: Mapping[str, float] = field(default_factory=dict)
    claims: Mapping[str, int] = field(default_factory=dict)
    direction: frozenset[str] = frozenset()

    def poisoned(self, client: str, start: np.ndarray, trained: np.ndarray, rnd: int = 0) -> np.ndarray:
        """What ``client`` returns after training ``start`` into ``trained`` in round ``rnd``."""
        if client in self.direction:
            trained = random_direction(start, trained, client, rnd)
        factor = self.scale.get(client)
        if factor is None:
            return trained
        return scale_update(start, trained, factor)

    def claimed(self, client: str, n_samples: int) -> int:
        """The sample count ``client`` reports when it holds ``n_samples``."""
        return int(self.claims.get(client, n_samples))

    def claimed_counts(self, client: str, counts: np.ndarray) -> np.ndarray:
        """The class counts ``client`` registers: its own, scaled to sum to its claim (a
        registration's counts must sum to its sample count)."""
        claim = self.claims.get(client)
        counts = np.asarray(counts, np.int64)
        if claim is None or counts.sum() == claim:
            return counts
        scaled = np.floor(counts * (claim / max(int(counts.sum()), 1))).astype(np.int64)
        scaled[int(np.argmax(counts))] += int(claim) - int(scaled.sum())
        return scaled


def random_direction(start: np.ndarray, trained: np.ndarray, client: str, rnd: int) -> np.ndarray:
    """``start`` plus a random direction scaled to ``||trained - start||``."""
    start64 = np.asarray(start, np.float64)
    norm = float(np.linalg.norm(np.asarray(trained, np.float64) - start64))
    rng = np.random.default_rng([zlib.crc32(client.encode()), int(rnd)])
    step = rng.standard_normal(start64.shape)
    return (start64 + step * (norm / float(np.linalg.norm(step)))).astype(np.float32)


def scale_update(start: np.ndarray, trained: np.ndarray, factor: float) -> np.ndarray:
    """``start + factor (trained - start)`` in float32 (the boosted update)."""
    start64 = np.asarray(start, np.float64)
    return (start64 + float(factor) * (np.asarray(trained, np.float64) - start64)).astype(np.float32)
