"""What a live run tells its dashboard, from the coordinator's own thread.

:class:`DashboardFeed` keeps the run's last results document (set after every round,
the same one ``results.json`` gets) and, at most every :data:`TICK_S`, adds the
coordinator's current view of its boards (online, last seen) and publishes the page
state to the :class:`~server.dashboard.live.LiveView`, and to a :class:`StateFile` that
a page served by another process follows (:class:`StateFileFeed`, for a field test's
coordinator in its own network namespace). The coordinator calls
:meth:`DashboardFeed.tick` from its message pump, so the page follows a board going
offline or a round starting within about a second, and no HTTP thread ever reads the
coordinator's state.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from server.dashboard.live import LiveView
from server.dashboard.state import FleetEntry, page_state

TICK_S = 0.5
log = logging.getLogger("covey.dashboard")


class StateView(Protocol):
    """Where a feed's page state goes (:class:`~server.dashboard.live.LiveView`,
    :class:`StateFile`, :class:`Views`)."""

    @property
    def listeners(self) -> int:
        """How many readers there are now (a feed skips its ticks when none)."""
        ...

    def publish(self, state: Mapping[str, Any]) -> None: ...


class DashboardFeed:
    """Publishes a live run's page state.

    Parameters
    ----------
    view : where the page's state goes (the page, a state file, or both).
    boards : the coordinator's boards now (called on the coordinator's thread).
    clock : monotonic seconds (the registry's ``last_seen`` clock).
    progress : where the round is, group by group
        (:meth:`~server.execution.round.RoundExecution.progress`).
    """

    def __init__(
        self,
        view: StateView,
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


class StateFile:
    """A page state kept in a file, for a page served by another process: ``covey
    field-test --dashboard`` serves the page on the host while the coordinator runs in a
    network namespace of its own (the two share the file system, not a network). The
    file is replaced whole (written beside it, then renamed), only when the state
    changed, so a reader never sees half of one."""

    listeners = 1  # always fed: whoever reads the file is not known here

    def __init__(self, path: Path) -> None:
        self.path = path
        self._text = ""

    def publish(self, state: Mapping[str, Any]) -> None:
        text = json.dumps(state, allow_nan=False, separators=(",", ":"))
        if text != self._text:
            # renamed into place, not synced to disk: it is a view, rewritten within a second
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, self.path)
            self._text = text


class Views:
    """Several views fed the same state (the live page, and a :class:`StateFile`)."""

    def __init__(self, *views: StateView) -> None:
        self.views = views

    @property
    def listeners(self) -> int:
        return sum(v.listeners for v in self.views)

    def publish(self, state: Mapping[str, Any]) -> None:
        for v in self.views:
            v.publish(state)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON a page can show")


class StateFileFeed:
    """Publishes the page state a coordinator elsewhere keeps in a :class:`StateFile`
    (``covey server run --dashboard-state FILE``), read again whenever the file changes
    (polled every :data:`TICK_S`): the fleet online or not, the round in progress, and
    the results, as that coordinator's own page would show them.

    Parameters
    ----------
    view : where the page's state goes.
    path : the coordinator's state file (it may not exist yet).
    """

    def __init__(self, view: LiveView, path: Path) -> None:
        self.view, self.path = view, path
        self._stop = threading.Event()
        self._seen: tuple[int, int, int] | None = None
        self._state: dict[str, Any] = page_state({}, status="starting")
        self._failing = False
        self.thread = threading.Thread(target=self._poll, name="dashboard-file-feed", daemon=True)

    def start(self) -> StateFileFeed:
        self.view.publish(self._state)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(TICK_S):
            self.read()

    def read(self) -> None:
        """Publish the file's state if it changed since the last read and is a page state.
        Nothing in the file can stop the feed: what the page cannot take is logged once
        and the page keeps its last state."""
        try:
            st = self.path.stat()
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen == self._seen:
                return
            state = json.loads(self.path.read_text(), parse_constant=_no_constant)
        except (OSError, ValueError, RecursionError):  # not there yet, or not whole JSON: later
            return
        self._seen = seen
        try:
            if not isinstance(state, dict) or not isinstance(state.get("run"), dict):
                raise ValueError("not a page state")
            self.view.publish(state)
        except Exception as exc:  # a corrupt or foreign file: the page keeps its last state
            if not self._failing:
                log.warning("%s: the page cannot show it (%s); it keeps its last state", self.path, exc)
            self._failing = True
            return
        self._failing = False
        self._state = state

    def finish(self) -> None:
        """The run is over: a last read, no more polling. A coordinator that stopped
        before it could say so (killed, or failed) is shown as ``stopped``, no longer
        running a round, and its boards' online status as not known."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
        self._seen = None
        self.read()
        run = self._state["run"]
        if run.get("status") != "finished":  # the state was published once, so it is a page state
            run.update(status="stopped", round_in_progress=None)
            self._state["progress"] = []
            for board in self._state.get("fleet") or []:
                if isinstance(board, dict):
                    board["online"] = None
            self.view.publish(self._state)
