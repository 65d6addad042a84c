"""The coordinator's evaluation and pre-training requests when a board never answers:
the round goes on at the deadline, and who did not answer is noted for the run's
events (results.json's ``run_events``, the dashboard)."""

from __future__ import annotations

import numpy as np

from device.protocol import Topics
from server.backend import EvalJob
from server.coordinator.requests import TaskRequests
from server.execution.shared import SharedModels


def test_a_board_that_never_answers_an_evaluation_is_named_in_the_run_events() -> None:
    # Prepare: two boards asked; neither answers (nothing pumps a reply in)
    topics = Topics("r")
    sent: list[str] = []

    def publish(topic: str, data: bytes, retain: bool) -> None:
        sent.append(topic)

    events: list[dict[str, object]] = []
    requests = TaskRequests(
        topics,
        publish,
        SharedModels(topics, publish, 1 << 20, "t"),
        lambda timeout: None,
        deadline_s=0.05,
        max_chunk=1 << 20,
        task_prefix="e",
        run_events=events,
    )
    job = EvalJob((np.zeros(4, np.float32),), ("dev001", "dev000"), "test")

    # Execute
    (rows,) = requests.evaluate([job], rnd=7)

    # Assert: no rows, both asked, both named once in the run's events
    assert rows == {} and {topics.inbox("dev000"), topics.inbox("dev001")} <= set(sent)
    assert events == [
        {"round": 7, "kind": "no reply", "device": "dev000", "detail": "evaluate"},
        {"round": 7, "kind": "no reply", "device": "dev001", "detail": "evaluate"},
    ]
