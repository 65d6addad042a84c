"""What a live run tells its dashboard, from the coordinator's own thread.

:class:`DashboardFeed` keeps the run's last results document (set after every round,
the same one ``results.json`` gets) and, at most every :data:`TICK_S`, adds the
coordinator's current view of its boards (online, last seen) and publishes the page
state to the :class:`~server.dashboard.live.LiveView`. The coordinator calls
:meth:`DashboardFeed.tick` from its message pump, so the page follows a board going
offline or a round starting within about a second, and no HTTP thread ever reads the
coordinator's state.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from server.dashboard.live import LiveView
from server.dashboard.state import FleetEntry, page_state

TICK_S = 0.5
log = logging.getLogger("covey.dashboard")


class DashboardFeed:
    """Publishes a live run's page state.

    Parameters
    ----------
    view : where the page's state goes.
    boards : the coordinator's boards now (called on the coordinator's thread).
    clock : monotonic seconds (the registry's ``last_seen`` clock).
    progress : where the round is, group by group
        (:meth:`~server.execution.round.RoundExecution.progress`).
    """

    def __init__(
        self,
        view: LiveView,
        boards: Callable[[], Iterable[FleetEntry]],
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.view, self.boards, self.clock, self.progress = view, boards, clock, progress
        self.doc: Mapping[str, Any] = {}
        self.status = "registering"
        self.round_in_progress: int | None = None
        self._last = float("-inf")
        self._failing = False

    def set_results(self, doc: Mapping[str, Any]) -> None:
        """The run's results as just written (:func:`server.records.run_document`)."""
        self.doc = doc
        self.publish()

    def set_status(self, status: str, round_in_progress: int | None = None) -> None:
        self.status, self.round_in_progress = status, round_in_progress
        self.publish()

    def tick(self) -> None:
        """Publish if :data:`TICK_S` passed since the last time and a page is open (the
        message pump's hook; rounds and status changes publish whether or not)."""
        if self.view.listeners and self.clock() - self._last >= TICK_S:
            self.publish()

    def publish(self) -> None:
        """Publish the state now. It runs on the coordinator's thread, so nothing it
        meets may stop the run: a failure is logged (once in a row) and the page keeps
        its last state."""
        self._last = self.clock()
        try:
            state = page_state(
                self.doc, live=list(self.boards()), status=self.status, round_in_progress=self.round_in_progress
            )
            if self.progress is not None and self.status == "running":
                state["progress"] = self.progress()
            self.view.publish(state)
        except Exception as exc:  # the page is a view: the run goes on without it
            if not self._failing:
                log.warning("the dashboard could not show the run's state (%s: %s)", type(exc).__name__, exc)
            self._failing = True
        else:
            self._failing = False


class ResultsFileFeed:
    """Publishes the page state of a run whose coordinator runs elsewhere (a field
    test's coordinator runs in its own network namespace) from its ``results.json``,
    read again whenever the file changes (polled every :data:`TICK_S`). Boards' online
    status is not in the file: the page shows what the rounds recorded.

    Parameters
    ----------
    view : where the page's state goes.
    results : the run's ``results.json`` (it may not exist yet).
    """

    def __init__(self, view: LiveView, results: Path) -> None:
        self.view, self.results = view, results
        self.status = "starting"
        self._stop = threading.Event()
        self._seen: tuple[int, int] | None = None
        self._doc: Mapping[str, Any] = {}
        self.thread = threading.Thread(target=self._poll, name="dashboard-file-feed", daemon=True)

    def start(self) -> ResultsFileFeed:
        self.publish()
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(TICK_S):
            self.read()

    def read(self) -> None:
        """Publish the file's state if it changed since the last read."""
        try:
            st = self.results.stat()
        except OSError:
            return
        if (st.st_mtime_ns, st.st_size) == self._seen:
            return
        try:
            doc = json.loads(self.results.read_text())
        except (OSError, ValueError):  # caught mid-write by another writer: the next poll reads it
            return
        if not isinstance(doc, dict):
            return
        self._seen, self._doc, self.status = (st.st_mtime_ns, st.st_size), doc, "running"
        self.publish()

    def publish(self) -> None:
        rounds = len(self._doc.get("rounds", [])) if isinstance(self._doc, Mapping) else 0
        running = rounds + 1 if self.status == "running" else None
        try:
            self.view.publish(page_state(self._doc, status=self.status, round_in_progress=running))
        except Exception as exc:  # a file the page cannot show: keep the last state, say so once
            log.warning("the dashboard could not show %s (%s: %s)", self.results, type(exc).__name__, exc)

    def finish(self) -> None:
        """The run is over: a last read, status finished, no more polling."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
        self._seen = None
        self.read()
        self.status = "finished"
        self.publish()
