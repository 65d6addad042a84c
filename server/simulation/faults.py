"""Misbehaving virtual devices, injected on purpose to test and measure robustness.

* ``unresponsive``: devices that never answer, like a board that is switched off.
  A parallel member is skipped; a chain goes on without it from the last good model
  (as the coordinator's group manager does, FedGSP Sec. 3.2); pre-training and
  evaluation requests get no reply from it.
* ``scale``: model poisoners. Device ``c`` returns ``start + scale[c] (trained -
  start)`` instead of its trained model: its honest update boosted by a factor, the
  "explicit boosting" of Bhagoji et al. (ICML 2019), which model-replacement attacks
  use (Bagdasaryan et al., AISTATS 2020). Its pre-training update is scaled alike.

Boards get the same treatment from ``tests/mqtt/poisoning_agent.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Faults:
    unresponsive: frozenset[str] = frozenset()
    scale: Mapping[str, float] = field(default_factory=dict)

    def poisoned(self, client: str, start: np.ndarray, trained: np.ndarray) -> np.ndarray:
        """What ``client`` returns after training ``start`` into ``trained``."""
        factor = self.scale.get(client)
        if factor is None:
            return trained
        return scale_update(start, trained, factor)


def scale_update(start: np.ndarray, trained: np.ndarray, factor: float) -> np.ndarray:
    """``start + factor (trained - start)`` in float32 (the boosted update)."""
    start64 = np.asarray(start, np.float64)
    return (start64 + float(factor) * (np.asarray(trained, np.float64) - start64)).astype(np.float32)
