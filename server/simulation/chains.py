"""How a direct chain with silent members runs on boards, as plain data.

The coordinator's manager (``server/coordinator/manager.py``) lets a chain's members
hand their models on device to device. A member that misses its deadline is skipped:
the manager asks the last member that answered to send its output again and forwards
it to the next member itself. So a direct chain runs as *runs* of members that answer
one after another, each run followed by the silent members the manager skips before
the next run starts from the forwarded model. Silent members before the first that
answers are not part of any run: the manager sends each of them, and the first that
answers, the start model (``VirtualDevices._receivers``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AnsweringRun:
    """Members that answer, in chain order, and the silent members right after them."""

    members: tuple[str, ...]
    silent_after: tuple[str, ...] = ()


def answering_runs(members: Sequence[str], answering: Collection[str]) -> list[AnsweringRun]:
    """The runs of a chain of ``members`` of whom ``answering`` answer.

    Parameters
    ----------
    members : the chain, in order.
    answering : the members that train and hand on when their turn comes.

    Returns
    -------
    list[AnsweringRun]
        In chain order; empty when nobody answers. Every member after the first that
        answers is in exactly one run, as a member or as one of its ``silent_after``.
    """
    runs: list[AnsweringRun] = []
    start = next((i for i, m in enumerate(members) if m in answering), len(members))
    i = start
    while i < len(members):
        j = i
        while j < len(members) and members[j] in answering:
            j += 1
        k = j
        while k < len(members) and members[k] not in answering:
            k += 1
        runs.append(AnsweringRun(tuple(members[i:j]), tuple(members[j:k])))
        i = k
    return runs
