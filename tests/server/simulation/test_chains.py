"""Direct chains with silent members split into runs of members that answer, as the
coordinator's manager skips them (server/simulation/chains.py)."""

from __future__ import annotations

import pytest

from server.simulation.chains import AnsweringRun, answering_runs


@pytest.mark.parametrize(
    ("members", "silent", "runs"),
    [
        ("abc", "", [AnsweringRun(("a", "b", "c"))]),
        ("abc", "b", [AnsweringRun(("a",), ("b",)), AnsweringRun(("c",))]),
        ("abc", "c", [AnsweringRun(("a", "b"), ("c",))]),
        ("abcde", "bcd", [AnsweringRun(("a",), ("b", "c", "d")), AnsweringRun(("e",))]),
        ("abcde", "ad", [AnsweringRun(("b", "c"), ("d",)), AnsweringRun(("e",))]),  # a: before any run
        ("abc", "abc", []),
        ("", "", []),
    ],
)
def test_a_chain_splits_where_its_silent_members_are(members: str, silent: str, runs: list[AnsweringRun]) -> None:
    answering = set(members) - set(silent)
    assert answering_runs(list(members), answering) == runs


def test_every_member_after_the_first_that_answers_is_in_exactly_one_run() -> None:
    members = [f"d{i}" for i in range(12)]
    answering = {"d2", "d3", "d6", "d9", "d10"}
    runs = answering_runs(members, answering)
    covered = [m for r in runs for m in (*r.members, *r.silent_after)]
    assert covered == members[2:]
    assert all(set(r.members) <= answering and not set(r.silent_after) & answering for r in runs)
