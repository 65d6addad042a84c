"""A model a device drops goes back to the system at once (device/memory.py).

Without the fixed mmap threshold glibc keeps a freed model-sized block on its heap after
the first one is freed, and a device training round after round held one model more than
it needed at its peak (222.4 MB instead of 199.4 MB for the FEMNIST CNN at batch 32).
Raspberry Pi OS and the Jetsons' Ubuntu run glibc; on Android (bionic) it does nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: the threshold is a process-wide setting, and the test
# process has long since pinned it (or raised it dynamically).
_DROP_MODELS = """
import sys
from pathlib import Path
import numpy as np
from device.runtime import TFLiteModel

def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

model = TFLiteModel(sys.argv[1])
before = rss_mb()
for _ in range(3):  # a round's start model (8 MB here) arrives, is used, and is dropped
    weights = np.ones(2_000_000, np.float32)
    weights = None
print(f"{rss_mb() - before:.3f}")
"""


def test_a_dropped_model_sized_array_leaves_the_resident_set(zoo_model: Any) -> None:
    # Prepare: a fresh process that loads a real model (which fixes the threshold)
    path = zoo_model("mlp_femnist")

    # Execute: three 8 MB arrays made and dropped after the model is loaded
    out = subprocess.run(
        [sys.executable, "-c", _DROP_MODELS, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    # Assert: nothing of them stays resident (glibc's dynamic threshold kept 7.6 MB)
    grown_mb = float(out.stdout.strip().splitlines()[-1])
    assert grown_mb < 1.0, f"{grown_mb:.1f} MB of dropped arrays stayed resident"


# Page faults of writing model-sized arrays one after another, once a model has loaded
# with the given release_memory.
_REFILL_MODELS = """
import resource
import sys
import numpy as np
from device.runtime import TFLiteModel

model = TFLiteModel(sys.argv[1], release_memory=sys.argv[2] == "True")
for _ in range(2):  # the first blocks go through glibc's dynamic threshold
    weights = np.ones(2_000_000, np.float32)
    weights = None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):  # a virtual device's start model, made, used and dropped
    weights = np.ones(2_000_000, np.float32)
    weights = None
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
def test_the_simulator_s_interpreters_leave_freed_models_for_reuse(zoo_model: Any) -> None:
    """``release_memory=False`` (the simulator's interpreters) leaves glibc's threshold
    dynamic: a freed model-sized block is reused by the next one instead of being
    unmapped and faulted in again, page by page, as it is on a board."""
    path = zoo_model("mlp_femnist")
    fresh_array_faults = 2_000_000 * 4 // (2 << 20)  # at least one per 2 MiB (transparent huge pages)

    faults = {}
    for release in (True, False):
        out = subprocess.run(
            [sys.executable, "-c", _REFILL_MODELS, str(path), str(release)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        faults[release] = int(out.stdout.strip().splitlines()[-1])

    assert faults[True] >= 4 * fresh_array_faults, faults  # a board: every array is fresh pages
    assert faults[False] < fresh_array_faults, faults  # the simulator: the same pages, reused
