"""Server optimizers FedAdagrad, FedAdam and FedYogi (Reddi et al., ICLR 2021, Alg. 2).

The pseudo-gradient of round t is the (sample-weighted) mean client update
``Δ_t = mean_i(x_i - x_t)``; then

* ``m_t = β1 m_{t-1} + (1 - β1) Δ_t``
* Adagrad: ``v_t = v_{t-1} + Δ_t²``
* Adam:    ``v_t = β2 v_{t-1} + (1 - β2) Δ_t²``
* Yogi:    ``v_t = v_{t-1} - (1 - β2) Δ_t² sign(v_{t-1} - Δ_t²)``
* ``x_{t+1} = x_t + η m_t / (sqrt(v_t) + τ)``

with ``v_{-1} = τ²`` as in the paper. Defaults follow its recommendations
(β1 = 0.9, β2 = 0.99, τ = 1e-3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from server.errors import GroupingError

OPTIMIZERS = ("adagrad", "adam", "yogi")


@dataclass
class ServerOptimizer:
    """State of one adaptive server optimizer; ``step`` returns the new global model."""

    kind: str = "adam"
    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    m: np.ndarray | None = field(default=None, repr=False)
    v: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise GroupingError(f"unknown server optimizer {self.kind!r}; choose one of {', '.join(OPTIMIZERS)}")
        if not (self.lr > 0 and 0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.tau > 0):
            raise GroupingError("server optimizer needs lr > 0, 0 <= β1, β2 < 1 and τ > 0")

    def step(self, x: np.ndarray, delta: np.ndarray) -> np.ndarray:
        x64 = np.asarray(x, np.float64)
        d = np.asarray(delta, np.float64)
        if d.shape != x64.shape:
            raise GroupingError(f"update has shape {d.shape}, model {x64.shape}")
        if self.m is None or self.v is None:
            self.m = np.zeros_like(x64)
            self.v = np.full_like(x64, self.tau**2)
        self.m = self.beta1 * self.m + (1 - self.beta1) * d
        d2 = d * d
        if self.kind == "adagrad":
            self.v = self.v + d2
        elif self.kind == "adam":
            self.v = self.beta2 * self.v + (1 - self.beta2) * d2
        else:
            self.v = self.v - (1 - self.beta2) * d2 * np.sign(self.v - d2)
        return (x64 + self.lr * self.m / (np.sqrt(self.v) + self.tau)).astype(np.float32)
