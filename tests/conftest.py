"""Shared fixtures: built zoo models (cached per source hash) and FEMNIST data."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

# Tests that stop a command with Ctrl-C (SIGINT) need it to reach the command. A suite
# started in the background by a shell without job control (`cmd &` in a script, nohup)
# inherits SIGINT *ignored*, and every process it starts would too: Python then never
# raises KeyboardInterrupt. Restore the default here, so the suite behaves the same
# however it was launched (CI runs it in the foreground, where this changes nothing).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("COVEY_CACHE_DIR", str(REPO / ".cache"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# agents the tests start train at normal priority: beside the coordinator, brokers and other
# tests on one loaded machine, SCHED_IDLE training (a board's default, on its own CPU)
# starves and misses deadlines that test the protocol, not the scheduler
os.environ.setdefault("COVEY_TRAIN_PRIORITY", "normal")


DURATIONS_KEY = "covey/durations"  # seconds per test id, from the last run here (.pytest_cache)
_durations: dict[str, float] = {}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (``./dev test``), every board test runs on one worker: they
    share the emulated boards, mounted once per worker and session, and the kernel's
    binfmt registration, which one worker's set-up would clear under another's.

    Longest first: xdist hands tests out in this order, so a minute-long broker or
    network-namespace test that started last would keep one worker busy while the others
    idle. Each test's length is what it took in the last run on this machine, else a
    guess from its markers (the board group, then slow and broker tests, then the rest)."""
    known: dict[str, float] = config.cache.get(DURATIONS_KEY, {}) if config.cache is not None else {}
    for item in items:
        if item.get_closest_marker("boards") is not None:
            item.add_marker(pytest.mark.xdist_group("boards"))
    items.sort(key=lambda item: -known.get(item.nodeid, _guessed_length(item)))


def _guessed_length(item: pytest.Item) -> float:
    if item.get_closest_marker("boards") is not None:
        return 1000.0  # the group runs on one worker for minutes: it leads
    if item.get_closest_marker("slow") is not None or item.get_closest_marker("broker") is not None:
        return 10.0
    return 0.1


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's set-up, call and tear-down time (under xdist, the controller sees all)."""
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _durations and session.config.cache is not None and not hasattr(session.config, "workerinput"):
        known = session.config.cache.get(DURATIONS_KEY, {})
        session.config.cache.set(DURATIONS_KEY, {**known, **_durations})


@pytest.fixture(scope="session")
def zoo_model():
    """``zoo_model(name) -> Path`` of the built .tflite (built once, then cached)."""
    from covey.paths import ensure_model

    return ensure_model


@pytest.fixture(scope="session")
def femnist():
    """``(train, test)`` dicts of writer -> Dataset from the shared LEAF sample."""
    from covey.paths import femnist_dir
    from device.data import read_leaf

    root = femnist_dir()
    return read_leaf(root / "train"), read_leaf(root / "test")


@pytest.fixture(scope="session")
def femnist_pooled(femnist):
    train, test = femnist
    cat = np.concatenate
    return (
        cat([d.x for d in train.values()]),
        cat([d.y for d in train.values()]),
        cat([d.x for d in test.values()]),
        cat([d.y for d in test.values()]),
    )


@pytest.fixture
def site_parent():
    """A folder every user can enter, removed afterwards: where tests make sites.

    Not pytest's ``tmp_path``, whose base folder is private to the user (0700): a
    mosquitto started as root (as in CI here) drops to the ``mosquitto`` user, which
    must reach the site's broker files, exactly as on a broker host."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="covey-site-test-"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
