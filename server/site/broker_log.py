"""What `covey broker run` shows of mosquitto's log: everything but the packet trace,
and the ACL's refusals counted per client.

mosquitto 2.0 logs a publish its ACL refuses ("Denied PUBLISH from dev003 (...)") only
at ``log_type debug``, beside a line for every packet sent and received. So `covey
broker run` turns debug on in a copy of the site's config and filters its output
here: the packet trace ("Received ...", "Sending ...") is dropped, the first refusal
of each client is shown at once, and later ones are summed into one line per client
every ``every_s`` seconds ("... and 94,371 more in 10 s"), so a board that floods
topics it may not write cannot flood the operator's terminal.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TRACE_PREFIXES = ("Received ", "Sending ")
DENIED = re.compile(r"^Denied (?P<what>[A-Z]+) from (?P<client>\S+) \(.*?'(?P<topic>[^']*)'")
DEBUG_LOG_TYPES = ("error", "warning", "notice", "information", "debug")
MAX_CLIENTS = 10_000  # clients with refusals tracked between two summaries


def with_denials(config_text: str) -> str:
    """The site's config with every log type on (debug shows the ACL's refusals)."""
    return (
        config_text.rstrip("\n")
        + "\n\n# added by `covey broker run`: refusals by the ACL are logged at debug\n"
        + ("".join(f"log_type {kind}\n" for kind in DEBUG_LOG_TYPES))
    )


@dataclass
class DeniedCounter:
    """Filters mosquitto's log lines; see the module docstring."""

    every_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _counts: dict[str, tuple[int, str]] = field(default_factory=dict)  # client -> (refusals, last topic)
    _shown: set[str] = field(default_factory=set)
    _since: float | None = None

    def feed(self, line: str) -> list[str]:
        """The lines to show for one line of mosquitto's output (with any summary due)."""
        out = self.due()
        stamp, _, text = line.rstrip("\n").partition(": ")
        body = text if stamp.isdigit() else line.rstrip("\n")
        if body.startswith(TRACE_PREFIXES):
            return out
        denied = DENIED.match(body)
        if denied is None:
            return [*out, line.rstrip("\n")]
        client, topic, what = denied["client"], denied["topic"], denied["what"]
        if client not in self._shown and len(self._shown) < MAX_CLIENTS:
            self._shown.add(client)
            return [*out, f"mosquitto: the ACL refused a {what} by {client} to {topic!r} (further refusals counted)"]
        if self._since is None:
            self._since = self.clock()
        n, _ = self._counts.get(client, (0, topic))
        if client in self._counts or len(self._counts) < MAX_CLIENTS:
            self._counts[client] = (n + 1, topic)
        return out

    def due(self, force: bool = False) -> list[str]:
        """The per-client summaries, once ``every_s`` passed since the first counted refusal."""
        if self._since is None or (not force and self.clock() - self._since < self.every_s):
            return []
        took = self.clock() - self._since
        lines = [
            f"mosquitto: the ACL refused {n:,} more publishes or subscriptions by {client} in {took:.0f} s "
            f"(last to {topic!r})"
            for client, (n, topic) in sorted(self._counts.items())
        ]
        self._counts, self._since = {}, None
        return lines
