"""Requests naming shared models are checked before the agent acts on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from device.agent import Agent, AgentConfig
from device.data import Dataset
from device.errors import ProtocolError
from device.protocol import SERVER_ID, Message


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    data = Dataset(np.zeros((4, 60), np.float32), np.arange(4))
    a = Agent(AgentConfig("dev001", "run1", "127.0.0.1", 1, tmp_path, train_priority="normal"), data)
    yield a
    a.worker.close()


@pytest.mark.parametrize(
    ("shared", "message"),
    [
        ("r1-g0-abc", "must be a list"),
        ([3], "must be a list"),
        (["r1/../x"], "model key"),
        ([f"k{i}" for i in range(65)], "must be a list"),
    ],
)
def test_bad_shared_keys_are_refused_before_anything_changes(agent: Agent, shared: object, message: str) -> None:
    request = Message("train", "run1", SERVER_ID, 1, {"task_id": "t1", "shared": shared})
    with pytest.raises(ProtocolError, match=message):
        agent._on_request(request)
    assert agent._waiting == {} and agent._shared_subscribed == set()
