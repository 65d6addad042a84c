"""A chain's group manager when members are late, frames are lost or the
coordinator's connection comes back mid-chain: it asks the right member for the right
model, never sends a member a stale one, and does not throw away a model a member
trained and still holds (server/execution/manager.py)."""

from __future__ import annotations

import numpy as np

from device.protocol import (
    DeviceHop,
    FrameExtra,
    ManagerHop,
    ResendRequest,
    Topics,
    TrainResult,
    decode_message,
    encode_frames,
)
from device.protocol.frames import Reassembler
from server.execution.chain import ChainManager
from server.execution.group_sender import Handoff
from server.strategies.base import GroupPlan, TrainConfig

DEADLINE_S = 10.0
N = 16


class Chain:
    """A ChainManager (direct hand-offs unless told), and what it published."""

    def __init__(self, members: str, handoff: Handoff = "direct") -> None:
        self.topics = Topics("r")
        self.sent: list[tuple[str, bytes]] = []
        self.start = np.zeros(N, np.float32)
        self.manager = ChainManager(
            GroupPlan(0, tuple(members), "chain", "m"),
            1,
            self.start,
            TrainConfig(),
            topics=self.topics,
            publish=lambda topic, data, retain: self.sent.append((topic, data)),
            handoff=handoff,
            deadline_s=DEADLINE_S,
            seed=0,
            max_chunk=1 << 30,
            task_prefix="t",
        )
        self.now = 0.0
        self.manager.start(self.now)
        self.tasks = self.manager.task_ids

    def take(self) -> list[tuple[str, bytes]]:
        out, self.sent = self.sent, []
        return out

    def resends(self, out: list[tuple[str, bytes]]) -> list[tuple[str, ResendRequest]]:
        """(device asked, request) for each resend request in ``out``."""
        found = []
        for topic, data in out:
            device = next((d for d in self.tasks if topic == self.topics.inbox(d)), None)
            if device is not None and isinstance(body := decode_message(data).body, ResendRequest):
                found.append((device, body))
        return found

    def models_to(self, out: list[tuple[str, bytes]]) -> dict[str, np.ndarray]:
        """The models the manager sent, by device."""
        models = {}
        for topic, data in out:
            device = next((d for d in self.tasks if topic == self.topics.frames(d)), None)
            if device is not None:
                payload = Reassembler().add(data)
                assert payload is not None
                models[device] = np.asarray(payload.array, np.float32)
        return models

    def report(self, device: str) -> None:
        result = TrainResult(self.tasks[device], 10, 0.5, 1, 0, 0, ())
        assert self.manager.on_result(device, result, self.now)

    def frame(self, device: str, task: str, value: float) -> bool:
        (data,) = encode_frames(
            np.full(N, value, np.float32),
            kind="result",
            run="r",
            round=1,
            group=0,
            sender=device,
            extra=FrameExtra(task, position=0),
            max_chunk=1 << 30,
        )
        payload = Reassembler().add(data)
        assert payload is not None
        return self.manager.on_frame(payload, np.asarray(payload.array, np.float32), self.now)

    def deadline(self) -> None:
        self.now += DEADLINE_S + 1
        self.manager.tick(self.now)


def _a_reports_then_the_deadline_passes(chain: Chain) -> list[tuple[str, bytes]]:
    """a trains and reports; the deadline passes (direct: b's turn; relay: a's frame is
    missing). What the manager published then."""
    chain.take()
    chain.report("a")
    chain.deadline()
    return chain.take()


def _skip_b_and_take_as_resend(chain: Chain) -> None:
    """:func:`_a_reports_then_the_deadline_passes` (direct); a's output (1.0) comes back as the resend."""
    assert [(d, r.to) for d, r in chain.resends(_a_reports_then_the_deadline_passes(chain))] == [("a", ManagerHop(0))]
    assert chain.frame("a", chain.tasks["a"], 1.0)


def test_a_late_member_whose_model_went_on_cancels_the_awaited_resend() -> None:
    # Prepare: b is skipped and a is asked to resend; b's late hand-off reaches c anyway
    chain = Chain("abcd")
    _a_reports_then_the_deadline_passes(chain)
    chain.report("c")

    # Execute: d misses its deadline
    chain.deadline()
    out = chain.take()

    # Assert: d is skipped and c (who holds the chain's model) is asked for it; d got no stale model
    assert [(d, r.task_id) for d, r in chain.resends(out)] == [("c", chain.tasks["c"])]
    assert chain.models_to(out) == {}
    assert [m.device for m in chain.manager.members if m.skipped] == ["b", "d"]


def test_after_a_reconnect_the_manager_sends_the_model_it_holds_to_the_member_after_a_skip() -> None:
    # Prepare: b skipped, a's resend in hand and forwarded to c
    chain = Chain("abc")
    _skip_b_and_take_as_resend(chain)
    assert set(chain.models_to(chain.take())) == {"c"}

    # Execute: the coordinator's connection came back
    chain.manager.resend_outstanding(chain.now)
    out = chain.take()

    # Assert: c gets a's output again from the manager; a is not asked to hand it to c
    # (c expects b's hand-off and would refuse a's)
    models = chain.models_to(out)
    assert set(models) == {"c"} and np.all(models["c"] == 1.0)
    assert chain.resends(out) == []


def test_after_a_reconnect_a_resend_that_may_be_lost_is_asked_through_the_manager_again() -> None:
    # Prepare: b skipped, a asked to resend; nothing came back yet
    chain = Chain("abc")
    _a_reports_then_the_deadline_passes(chain)

    # Execute
    chain.manager.resend_outstanding(chain.now)
    out = chain.take()

    # Assert: through the manager, not straight to c; then a's resend is taken
    assert [(d, r.to) for d, r in chain.resends(out)] == [("a", ManagerHop(0))]
    assert chain.frame("a", chain.tasks["a"], 1.0)
    assert np.all(chain.models_to(chain.take())["c"] == 1.0)


def test_after_a_reconnect_with_no_skip_the_last_good_member_hands_on_straight() -> None:
    # Prepare: a reported; b has not yet
    chain = Chain("abc")
    chain.take()
    chain.report("a")

    # Execute
    chain.manager.resend_outstanding(chain.now)
    out = chain.take()

    # Assert
    assert [(d, r.to) for d, r in chain.resends(out)] == [("a", DeviceHop("b", chain.tasks["b"]))]


def test_a_lost_final_frame_is_asked_for_again_from_the_member_that_trained_it() -> None:
    # Prepare: b skipped, a's output (1.0) forwarded to c; c reports but its frame never comes
    chain = Chain("abc")
    _skip_b_and_take_as_resend(chain)
    chain.take()
    chain.report("c")

    # Execute: c's frame misses the deadline; c sends it again when asked
    chain.deadline()
    asked = chain.resends(chain.take())
    assert chain.frame("c", chain.tasks["c"], 3.0)

    # Assert: c's own work ends the chain, nobody is skipped but b
    assert [(d, r.task_id, r.to) for d, r in asked] == [("c", chain.tasks["c"], ManagerHop(0))]
    assert chain.manager.done and chain.manager.final is not None and np.all(chain.manager.final == 3.0)
    assert [m.device for m in chain.manager.members if m.skipped] == ["b"]


def test_a_final_frame_lost_twice_falls_back_on_the_last_member_that_answered_not_a_skipped_one() -> None:
    # Prepare: as above, but c does not send its frame again either
    chain = Chain("abc")
    _skip_b_and_take_as_resend(chain)
    chain.take()
    chain.report("c")
    chain.deadline()
    chain.take()

    # Execute
    chain.deadline()
    out = chain.take()

    # Assert: b (skipped, silent) is not asked; the chain ends with a's output, which the manager holds
    assert chain.resends(out) == []
    assert chain.manager.done and chain.manager.final is not None and np.all(chain.manager.final == 1.0)


def test_a_relayed_member_whose_frame_was_lost_is_asked_for_it_once_before_it_is_skipped() -> None:
    # Prepare: a relayed chain; a reports but its frame never reaches the manager
    chain = Chain("abc", handoff="relay")
    chain.take()
    chain.report("a")

    # Execute: the deadline passes, a sends its output again when asked
    chain.deadline()
    asked = chain.resends(chain.take())
    assert chain.frame("a", chain.tasks["a"], 1.0)

    # Assert: a's output goes on to b, and nobody was skipped
    assert [(d, r.to) for d, r in asked] == [("a", ManagerHop(0))]
    assert np.all(chain.models_to(chain.take())["b"] == 1.0)
    assert not any(m.skipped for m in chain.manager.members)


def test_only_the_awaited_task_is_taken_as_the_resend() -> None:
    # Prepare: b skipped, a asked to resend
    chain = Chain("abc")
    _a_reports_then_the_deadline_passes(chain)

    # Execute: a frame from a under another task id, then the real resend
    other = chain.frame("a", "not-this-round", 9.0)
    real = chain.frame("a", chain.tasks["a"], 1.0)

    # Assert
    assert not other and real
    assert np.all(chain.models_to(chain.take())["c"] == 1.0)


def test_a_relayed_member_asked_once_in_vain_is_skipped_and_the_next_gets_the_last_good_model() -> None:
    # Prepare: a reports, its frame never comes, nor after it is asked again
    chain = Chain("abc", handoff="relay")
    _a_reports_then_the_deadline_passes(chain)

    # Execute
    chain.deadline()
    out = chain.take()

    # Assert: asked once only; a is skipped; b gets the start model
    assert chain.resends(out) == []
    assert [m.device for m in chain.manager.members if m.skipped] == ["a"]
    models = chain.models_to(out)
    assert set(models) == {"b"} and np.all(models["b"] == 0.0)


def test_after_a_reconnect_a_member_asked_for_its_output_is_asked_again_not_sent_its_input() -> None:
    # Prepare: relayed a reported, its frame lost, the manager asked for it
    chain = Chain("abc", handoff="relay")
    _a_reports_then_the_deadline_passes(chain)

    # Execute: the coordinator's connection came back (the request may have been lost)
    chain.manager.resend_outstanding(chain.now)
    out = chain.take()

    # Assert
    assert [(d, r.task_id, r.to) for d, r in chain.resends(out)] == [("a", chain.tasks["a"], ManagerHop(0))]
    assert chain.models_to(out) == {}


def test_a_member_whose_result_was_lost_but_whose_hand_off_went_on_does_not_hold_the_chain_up() -> None:
    # Prepare: a reports; c reports too (b's hand-off reached it, b's result did not)
    chain = Chain("abcd")
    chain.take()
    chain.report("a")
    chain.report("c")

    # Execute: b's deadline passes; d trains from c's hand-off and returns the chain's model
    chain.deadline()
    out = chain.take()
    chain.report("d")
    assert chain.frame("d", chain.tasks["d"], 4.0)

    # Assert: only b is skipped, nobody is asked to resend, the chain ends with d's model
    assert chain.resends(out) == [] and chain.models_to(out) == {}
    assert [m.device for m in chain.manager.members if m.skipped] == ["b"]
    assert chain.manager.done and chain.manager.final is not None and np.all(chain.manager.final == 4.0)


def test_after_a_reconnect_the_resend_a_chain_ending_in_a_skip_waits_for_is_asked_again() -> None:
    # Prepare: a reports; b (the last) misses its deadline; a is asked to resend
    chain = Chain("ab")
    assert [(d, r.to) for d, r in chain.resends(_a_reports_then_the_deadline_passes(chain))] == [("a", ManagerHop(0))]

    # Execute
    chain.manager.resend_outstanding(chain.now)
    out = chain.take()

    # Assert: asked again; its answer ends the chain
    assert [(d, r.to) for d, r in chain.resends(out)] == [("a", ManagerHop(0))]
    assert chain.frame("a", chain.tasks["a"], 1.0)
    assert chain.manager.done and chain.manager.final is not None and np.all(chain.manager.final == 1.0)


def test_what_the_manager_sends_again_is_counted_for_the_round_record() -> None:
    # Prepare: a reported; b and c have not; nothing was sent again yet
    chain = Chain("abc")
    chain.take()
    chain.report("a")
    assert chain.manager.resends == 0

    # Execute: the coordinator's connection came back
    chain.manager.resend_outstanding(chain.now)
    out = chain.take()

    # Assert: every message it published again is counted: b's and c's requests, and a
    # asked to hand its output on again
    again = [decode_message(data).body for topic, data in out if topic in {chain.topics.inbox(d) for d in "abc"}]
    assert [type(b).__name__ for b in again].count("TrainRequest") == 2 and len(chain.resends(out)) == 1
    assert chain.manager.resends == len(again) == 3
