"""Give freed models back to the operating system at once (glibc's mmap threshold).

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB to start)
with its own ``mmap`` and unmaps it on ``free``. But the threshold is dynamic: the first
time such a block is freed, glibc raises the threshold to the block's size (up to
32 MiB), so every later allocation of that size comes from the heap, and a heap block
that is freed stays resident for the next one. A model is exactly such a block (26 MB
for the FEMNIST CNN): after the first round's weights are dropped, the next round's
result is taken from fresh heap pages while the freed ones stay resident, and the
device's peak grows by a model (measured in docs/results.md, "On-device training", its
"Device memory" paragraph: the FEMNIST CNN at batch 32).

Setting the threshold explicitly turns the dynamic adjustment off (``mallopt(3)``).
:func:`pin_mmap_threshold` sets it to 1 MiB: a weight vector, a chunked payload or a
decoded model is mapped on its own and unmapped when freed, while the many small
arrays of a training step (a batch of 32 FEMNIST images is 100 KB) stay on the heap
as before. The cost is a page fault per 4 KiB when such a block is first written,
which the device pays anyway for every fresh model.

Only glibc has this threshold. Elsewhere (Android's bionic, musl) the call does
nothing; so does a process started with ``MALLOC_MMAP_THRESHOLD_`` or a
``glibc.malloc.mmap_threshold`` tunable in its environment, which states the user's
own choice. The setting is process-wide and made wherever a model loads with
``TFLiteModel(release_memory=True)``, the default: on a board, and in the coordinator.
The simulator's interpreters load with ``release_memory=False`` and leave the
threshold dynamic, because there the mappings cost more than they save: every
virtual device's start model, trained model and update norm would be a fresh
model-sized block whose pages fault in on first write, a cost in every simulated
client's task, while a model less at the peak matters on a board, not in the simulator.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20

_pinned: bool | None = None


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold so that large freed blocks return to the system.

    Parameters
    ----------
    threshold
        Allocations of at least this many bytes get their own mapping.

    Returns
    -------
    bool
        Whether the threshold is fixed in this process (False off glibc, or when the
        environment sets it). Only the first call acts; later ones return its answer.
    """
    global _pinned
    if _pinned is not None:
        return _pinned
    _pinned = False
    chosen = "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", "")
    if not sys.platform.startswith("linux") or chosen:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _pinned = mallopt(M_MMAP_THRESHOLD, int(threshold)) == 1
    return _pinned
