"""The coordinator's checkpoints and round journal (a mixin of :class:`Coordinator`).

After every round: the round, the registry, the records and the strategy (JSON + npz,
no pickle, written atomically). Right after planning a round: the *journal* — the
plan, its task ids' prefix and the strategy as planning left it — so a coordinator
resumed after a crash finishes that very round with the same task ids: devices that
already trained deliver what they hold at once, and nothing is counted twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from server.coordinator import checkpoint
from server.rounds import RoundDriver, record_from_dict, records_as_dicts
from server.strategies.base import RoundPlan, Strategy

if TYPE_CHECKING:
    from server.coordinator.coordinator import CoordinatorConfig
    from server.coordinator.execution import RoundExecution
    from server.coordinator.registry import DeviceRecord, Registry
    from server.rounds import RoundRecord

log = logging.getLogger("covey.server")


class Persistence:
    cfg: CoordinatorConfig
    driver: RoundDriver
    strategy: Strategy
    registry: Registry
    execution: RoundExecution
    round: int
    _started: bool
    _resumed_plan: RoundPlan | None

    @property
    def devices(self) -> dict[str, DeviceRecord]:
        return self.registry.devices

    @property
    def records(self) -> list[RoundRecord]:
        return self.driver.records

    def _state(self) -> dict[str, Any]:
        return {
            "round": self.driver.rnd,
            "model_bytes": self.driver.model_bytes,
            "strategy": self.strategy,
            "devices": self.devices,
            "records": records_as_dicts(self.records),
        }

    def checkpoint(self) -> None:
        """Round, registry, records and the strategy's state (JSON + npz, no pickle)."""
        checkpoint.save(self._state(), self.cfg.state_dir)
        checkpoint.remove(self.cfg.state_dir, "journal")

    def _journal(self, plan: RoundPlan) -> None:
        """The round's plan and the strategy as planning left it, with the task ids'
        prefix: a coordinator resumed after a crash finishes this very round."""
        prefix = self.execution.next_prefix(self.driver.rnd)  # the one this plan will execute with
        state = {**self._state(), "round": self.driver.rnd, "plan": plan, "task_prefix": prefix}
        checkpoint.save(state, self.cfg.state_dir, "journal")

    def resume(self) -> bool:
        """Continue from the last checkpoint, and finish a round the journal shows was
        in progress (same plan, same task ids: devices deliver what they already
        trained at once and nothing is counted twice)."""
        state = checkpoint.load(self.cfg.state_dir)
        journal = checkpoint.load(self.cfg.state_dir, "journal")
        done = int(state["round"]) if state is not None else 0
        if journal is not None and int(journal["round"]) != done + 1:
            journal = None  # a stale journal: its round was checkpointed
        source = state if state is not None else journal
        if source is None:
            return False
        self.registry.devices.update(source.get("devices", {}))  # devices registered before the restart
        records = [record_from_dict(r) for r in source.get("records", [])]
        self.driver.resume(done, records, int(source.get("model_bytes", 0)))
        self.strategy = self.driver.strategy = source["strategy"]
        if journal is not None:
            self.strategy = self.driver.strategy = journal["strategy"]
            self._resumed_plan = journal["plan"]
            self.execution.task_prefix = str(journal["task_prefix"])
        self.round = done
        self._started = True
        log.info("resumed after round %d%s", done, f"; finishing round {done + 1}" if journal is not None else "")
        return True
