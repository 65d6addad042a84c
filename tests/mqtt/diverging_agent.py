"""covey's agent whose training always diverges: every train request ends in the
runtime's ``WeightsError`` ("training diverged"), as a board with a learning rate far
too high would. The real agent then reports a typed ``failed`` result, so the group
goes on without it at once. Run like covey-device (``server/fleet.py`` ``scripts``)."""

from __future__ import annotations

import sys
from typing import Any

from device import cli, tasks
from device.errors import WeightsError


def _diverges(*args: Any, **kwargs: Any) -> Any:
    raise WeightsError("training diverged: weights became NaN or infinite; lower the learning rate")


tasks.train_locally = _diverges  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
