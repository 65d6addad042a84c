"""covey's agent, silent: it registers with its data (so strategies group it as any
other device) and then ignores every train, pre-train and evaluation request, as a
board that hangs or lost its radio after joining. ``Faults(unresponsive=...)`` is the
simulator's twin of it.

Run like covey-device: ``python tests/mqtt/silent_agent.py --broker ... --run ... --id ...``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from device import cli, tasks

log = logging.getLogger("covey.device")


def _ignore(kind: str) -> Any:
    def ignore(self: tasks.TaskRunner, request: Any, *rest: Any) -> None:
        log.info("%s: ignored the %s request %s (a silent device)", self.me, kind, getattr(request, "task_id", ""))

    return ignore


tasks.TaskRunner.train = _ignore("train")  # type: ignore[method-assign]
tasks.TaskRunner.pretrain = _ignore("pretrain")  # type: ignore[method-assign]
tasks.TaskRunner.evaluate = _ignore("evaluate")  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
