"""Log lines on the terminal that do not run into progress bars.

A tqdm bar redraws its line with a carriage return and no newline, so a log record
written to stderr while a bar is shown lands at the end of the bar's line
(``... 0/3 [00:00<?, ?round/s]2026-… INFO device.runtime: loaded …``). The
handler here writes each record with ``tqdm.write``, which clears the bars, writes
the line and draws the bars again below it; with no bar shown that is a plain write.

A process forked from the one that installed the handler (``--worker-kind
process``) writes the same way: it clears the terminal's bar line, writes its record
and draws its copy of the bar below, which the parent's next update overwrites.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["BarAwareHandler", "setup_logging"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class BarAwareHandler(logging.StreamHandler):
    """A ``StreamHandler`` that writes through ``tqdm.write`` (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except RecursionError:  # as logging.StreamHandler does
            raise
        except Exception:
            self.handleError(record)


def setup_logging(verbose: bool) -> None:
    """Root logging for a ``covey`` command: INFO with ``-v``, else WARNING and up."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=FORMAT, handlers=[BarAwareHandler()])
