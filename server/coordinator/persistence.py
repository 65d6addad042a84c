"""The coordinator's checkpoints and round journal.

After every round: the round, the registry, the records, the strategy and the
screening history (the accepted update norms its reference comes from) (JSON + npz,
no pickle, written atomically). Right after planning a round: the *journal* — the
plan, its task ids' prefix and the strategy as planning left it — so a coordinator
resumed after a crash finishes that very round with the same task ids: devices that
already trained deliver what they hold at once, and nothing is counted twice.

:class:`Persistence` is a collaborator of the coordinator: it reads the round driver
and the registry it is given and writes their state; :meth:`Persistence.resume` puts
a saved state back into them and says what is left to do.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device.errors import ConfigError
from server.backend import record_from_dict, records_as_dicts
from server.coordinator import checkpoint
from server.coordinator.registry import Registry
from server.rounds import RoundDriver
from server.strategies.base import RoundPlan

log = logging.getLogger("covey.server")


@dataclass(frozen=True)
class Resumed:
    """What a resumed coordinator does next: the last round checkpointed, and, when the
    journal shows a round in progress, that round's plan and task-id prefix."""

    done: int
    plan: RoundPlan | None = None
    task_prefix: str | None = None


class Persistence:
    """Checkpoints and the journal of one run, in ``state_dir``.

    Parameters
    ----------
    state_dir : where the files go (created if missing).
    driver : the round driver whose round, records, model bytes and strategy are saved
        and, on resume, restored.
    registry : the devices registered so far (saved; restored on resume).
    """

    def __init__(self, state_dir: Path, driver: RoundDriver, registry: Registry) -> None:
        self.state_dir, self.driver, self.registry = state_dir, driver, registry
        state_dir.mkdir(parents=True, exist_ok=True)

    def _state(self) -> dict[str, Any]:
        return {
            "round": self.driver.rnd,
            "model_bytes": self.driver.model_bytes,
            "strategy": self.driver.strategy,
            "devices": self.registry.devices,
            "records": records_as_dicts(self.driver.records),
            "screening_history": self.driver.screening_history(),
        }

    def checkpoint(self) -> None:
        """Round, registry, records, the strategy's state and the screening history
        (JSON + npz, no pickle)."""
        checkpoint.save(self._state(), self.state_dir)
        checkpoint.remove(self.state_dir, "journal")

    def journaler(self, prefix_of: Callable[[int], str]) -> Callable[[RoundPlan], None]:
        """What the round driver calls right after planning (``on_planned``): journal the
        plan with the task-id prefix ``prefix_of(round)`` it will execute with."""

        def journal(plan: RoundPlan) -> None:
            rnd = self.driver.rnd
            state = {**self._state(), "round": rnd, "plan": plan, "task_prefix": prefix_of(rnd)}
            checkpoint.save(state, self.state_dir, "journal")

        return journal

    def resume(self) -> Resumed | None:
        """Restore the last checkpoint into the driver and the registry, or None when
        there is none. A journal of the round after it (a round in progress at the
        crash) gives the plan and task ids to finish that very round with (devices
        deliver what they already trained at once and nothing is counted twice)."""
        state = checkpoint.load(self.state_dir)
        journal = checkpoint.load(self.state_dir, "journal")
        done = int(state["round"]) if state is not None else 0
        if journal is not None and int(journal["round"]) != done + 1:
            journal = None  # a stale journal: its round was checkpointed
        source = state if state is not None else journal
        if source is None:
            return None
        self.registry.devices.update(source.get("devices", {}))  # devices registered before the restart
        records = [record_from_dict(r) for r in source.get("records", [])]
        # the strategy first: resume() applies this run's aggregation setting to it
        self.driver.strategy = (journal if journal is not None else source)["strategy"]
        history = _screening_history(source.get("screening_history"))
        self.driver.resume(done, records, int(source.get("model_bytes", 0)), history)
        resumed = Resumed(done)
        if journal is not None:
            resumed = Resumed(done, journal["plan"], str(journal["task_prefix"]))
        log.info("resumed after round %d%s", done, f"; finishing round {done + 1}" if journal is not None else "")
        return resumed


def _screening_history(raw: object) -> dict[str, list[list[float]]] | None:
    """A checkpoint's screening history, checked: kind -> rounds -> finite norms."""
    if raw is None:
        return None  # a checkpoint from before the history was kept

    def norm(v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"malformed checkpoint: screening history holds {v!r}, not an update norm")
        return float(v)

    if not isinstance(raw, dict) or not all(isinstance(r, list) for r in raw.values()):
        raise ConfigError("malformed checkpoint: the screening history is not kind -> rounds of norms")
    out: dict[str, list[list[float]]] = {}
    for kind, rounds in raw.items():
        if not all(isinstance(r, list) for r in rounds):
            raise ConfigError(f"malformed checkpoint: screening history {kind!r} is not a list of rounds")
        out[str(kind)] = [[norm(v) for v in r] for r in rounds]
    return out
