"""Counts a device reports are checked for plausibility by the protocol: one registration
claiming 10**400 samples, or an evaluation row claiming 10**400 test samples, used to
overflow the coordinator's sample-weighted sums and end the run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from device.errors import ProtocolError
from device.protocol import EvalRow, EvaluateResult, Message, PretrainResult, Register, TrainResult, decode_message

HUGE = 10**400  # JSON carries it; a float cannot
MAX_SAMPLES = 2**31 - 1  # device.protocol.messages.MAX_SAMPLES


def _with(body: object, **change: object) -> bytes:
    raw = json.loads(Message.of(body, run="site", sender="dev001").encode())
    raw["body"].update(change)
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with(Register(10, 0, (4, 6), "x", 1), n_samples=HUGE, class_counts=[HUGE, 0]), "n_samples exceeds"),
        (_with(Register(10, 0, (4, 6), "x", 1), n_test=HUGE), "n_test exceeds"),
        (_with(TrainResult("t", 10, 0.5, 1, 0, 0, (4, 6)), n_samples=HUGE), "n_samples exceeds"),
        (_with(TrainResult("t", 10, 0.5, 1, 0, 0, (4, 6)), class_counts=[HUGE, 1]), "class_counts exceeds"),
        (_with(PretrainResult("t", 10, 0.5, 1), n_samples=MAX_SAMPLES + 1), "n_samples exceeds"),
        (
            _with(
                EvaluateResult("t", (EvalRow(0, 0.3, 7, 9),)),
                evaluations=[{"index": 0, "loss": 0.3, "correct": 1, "n": HUGE}],
            ),
            "n exceeds",
        ),
        (
            _with(
                EvaluateResult("t", (EvalRow(0, 0.3, 7, 9),)),
                evaluations=[{"index": 0, "loss": 0.3, "correct": 10, "n": 9}],
            ),
            "10 correct of 9",
        ),
        (
            _with(
                EvaluateResult("t", (EvalRow(0, 0.3, 7, 9),)),
                evaluations=[{"index": 0, "loss": -1, "correct": 1, "n": 9}],
            ),
            "never negative",
        ),
    ],
    # named by what is wrong: the encoded messages carry a random id and the time, and
    # every pytest-xdist worker must collect the same test names
    ids=lambda value: value if isinstance(value, str) else "message",
)
def test_implausible_counts_are_refused_by_the_protocol(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_message(data)


def test_the_overflow_they_caused_downstream() -> None:
    # what a registration of 10**300 samples did to FedAvg's weighted average
    from server.aggregation.fedavg import weighted_average
    from server.errors import GroupingError

    with pytest.raises((GroupingError, OverflowError)):
        weighted_average([np.zeros(2), np.ones(2)], [HUGE, HUGE])
    assert weighted_average([np.zeros(2), np.ones(2)], [MAX_SAMPLES, MAX_SAMPLES]).tolist() == [0.5, 0.5]
