"""A device trains into its start model's buffer only when nothing needs it afterwards
(``device/tasks.py``): no other task holds the array, the output is not an int8 delta
against it, and the server said ``discard_start`` (no downlink delta will name it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from device.data import Dataset
from device.protocol import SERVER_ID, Topics, TrainRequest
from device.protocol.messages import LocalTraining, ManagerHop
from device.runtime import TFLiteModel
from device.state import AgentState
from device.tasks import TaskRunner


@pytest.mark.parametrize(
    ("exclusive", "codec", "discard_start", "in_place"),
    [
        (True, "raw", True, True),  # an fp32 run, the task's own model: trained into
        (True, "fp16", True, True),
        (False, "raw", True, False),  # a shared model another task holds too
        (True, "raw", False, False),  # the server may send a delta against it (or did not say)
        (True, "int8", True, False),  # the output is a delta against it
    ],
)
def test_the_start_model_is_trained_into_only_when_nothing_needs_it(
    zoo_model: Any, tmp_path: Path, exclusive: bool, codec: str, discard_start: bool, in_place: bool
) -> None:
    # Prepare: a real runner and model; the worker seam runs the call here
    model = TFLiteModel(zoo_model("mclr_synthetic"))
    rng = np.random.default_rng(5)
    data = Dataset(rng.random((30, 60), dtype=np.float32), rng.integers(0, 10, 30))
    sent: list[tuple[str, bytes]] = []
    runner = TaskRunner(
        "dev001",
        Topics("r"),
        model,
        data,
        None,
        AgentState(tmp_path),
        publish=lambda topic, payload, retain: sent.append((topic, payload)),
        send=lambda body, rnd: None,
        in_worker=lambda fn, *args, **kwargs: fn(*args, **kwargs),
        max_chunk=1 << 20,
    )
    request = TrainRequest(
        "t1",
        0,
        0,
        "parallel",
        SERVER_ID,
        ManagerHop(0),
        LocalTraining(1, 5, 0.1),
        3,
        codec=codec,
        discard_start=discard_start,  # type: ignore[arg-type]
    )
    start = rng.normal(0, 0.05, model.n_params).astype(np.float32)
    original = start.copy()

    # Execute
    runner.train(request, 1, start, "a" * 64, None, exclusive)

    # Assert: the held result is the trained model; the start buffer took it or is intact
    (held,) = runner.state.held.values()
    assert not np.array_equal(held.weights, original)
    assert np.shares_memory(held.weights, start) is in_place
    assert np.array_equal(start, held.weights if in_place else original)
    assert sent  # the output went out either way
