"""The model worker: background priority, exceptions carried back, waits that end."""

from __future__ import annotations

import os
import threading
import time

import pytest

from device.errors import ConfigError
from device.worker import ModelWorker


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_model_calls_run_in_one_idle_priority_thread() -> None:
    worker = ModelWorker("idle")
    try:
        policy, thread = worker.run(lambda: (os.sched_getscheduler(0), threading.get_ident()))
        again = worker.run(threading.get_ident)
    finally:
        worker.close()
    assert policy == os.SCHED_IDLE
    assert thread == again != threading.get_ident()  # one thread, not the caller's
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller keeps its priority


def test_normal_priority_leaves_the_policy_alone() -> None:
    worker = ModelWorker("normal")
    try:
        assert worker.run(os.sched_getscheduler, 0) == os.sched_getscheduler(0)
    finally:
        worker.close()


def test_errors_come_back_to_the_caller_and_abandoned_waits_end() -> None:
    worker = ModelWorker("normal")
    try:
        with pytest.raises(ValueError, match="bad batch"):
            worker.run(lambda: (_ for _ in ()).throw(ValueError("bad batch")))
        with pytest.raises(TimeoutError, match="abandoned"):
            worker.run(time.sleep, 0.5, poll_s=0.05, keep_waiting=lambda: False)
    finally:
        worker.close()


def test_unknown_priority_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="idle"):
        ModelWorker("realtime")
