"""Each relayed chain hand-off is screened on arrival, in the manager and in the
simulator alike: one bad member costs only itself (server/hops.py).

Attack (issue 26, 2): FedGSP, one chain of seven FEMNIST writers, one member boosting
its update x100: the whole chain was refused every round (accuracy 0.2 %); x9 passed
whole (37 % -> 17 %)."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import StrategyError
from server.hops import HopBound, hop_bound
from server.screening import ScreeningConfig
from tests.server.test_manager_chains import Chain, N

BOUND = HopBound(reference=1.0, norm_factor=10.0, clip_factor=3.0)


@pytest.mark.parametrize(
    ("step", "verdict", "norm_after"),
    [
        (0.5, "accepted", 0.5),
        (2.9, "accepted", 2.9),
        (5.0, "clipped", 3.0),
        (9.9, "clipped", 3.0),
        (10.5, "refused", None),
    ],
)
def test_a_hand_off_is_accepted_clipped_or_refused_by_its_own_update(step, verdict, norm_after) -> None:
    start = np.ones(N, np.float32)
    direction = np.zeros(N, np.float32)
    direction[3] = 1.0
    out, got = BOUND.check(start, start + step * direction)
    assert got == verdict
    if norm_after is None:
        assert out is None
    else:
        assert out is not None and np.linalg.norm(out - start) == pytest.approx(norm_after, rel=1e-5)


def test_a_hand_off_that_is_not_finite_is_refused_even_without_a_reference() -> None:
    start = np.zeros(N, np.float32)
    unknown = HopBound(float("nan"), 10.0, 3.0)
    assert unknown.check(start, np.full(N, np.nan, np.float32)) == (None, "refused")
    assert unknown.check(start, np.full(N, 1e30, np.float32))[1] == "accepted"  # no scale known: only finiteness
    assert unknown.check(start, np.full(N, np.inf, np.float32))[1] == "refused"


def test_the_reference_comes_from_past_rounds_and_the_server() -> None:
    config = ScreeningConfig()
    off = hop_bound(None, {}, 1.0)  # screening off: the aggregate guard's bound, no clipping
    assert (off.reference, off.norm_factor, off.clip_factor) == (1.0, 1000.0, None)
    assert np.isnan(hop_bound(config, {"member": [1.0]}, None).reference)  # too few, no server
    assert hop_bound(config, {}, 0.4).reference == 0.4  # the server's own update alone
    past = {"member": [0.2, 0.3], "chain": [0.5, 9.0]}
    assert hop_bound(config, past, None).reference == 0.3  # lower median of four
    assert hop_bound(config, past, 0.4).reference == 0.4


def test_a_hand_off_is_clipped_tighter_than_a_parallel_update() -> None:
    """A chain passes each member's model on whole: its hand-offs are clipped at
    ``hop_clip_factor`` (2 by default), a parallel member's update at ``clip_factor`` (3)."""
    config = ScreeningConfig()
    bound = hop_bound(config, {}, 1.0)
    assert (bound.norm_factor, bound.clip_factor) == (10.0, 2.0)
    out, verdict = bound.check(np.zeros(N, np.float32), np.full(N, 2.5 / np.sqrt(N), np.float32))
    assert verdict == "clipped" and float(np.linalg.norm(out)) == pytest.approx(2.0, rel=1e-5)
    assert hop_bound(ScreeningConfig(hop_clip_factor=3.0), {}, 1.0).clip_factor == 3.0
    with pytest.raises(StrategyError, match="hop clip factor"):
        ScreeningConfig(hop_clip_factor=0.5)


def _relay_chain(bound: HopBound | None) -> Chain:
    chain = Chain("abc", handoff="relay")
    chain.manager.hop = bound
    chain.take()
    return chain


def test_the_manager_goes_on_from_a_refused_members_input_and_does_not_credit_it() -> None:
    # Prepare: a relayed chain a -> b -> c from zeros; a reference of 1 per member
    chain = _relay_chain(HopBound(1.0 / np.sqrt(N), 10.0, 3.0))

    # Execute: a moves every weight by 0.1 (norm 0.4: fine), b by 100 (refused), c by 0.1
    assert chain.frame("a", chain.tasks["a"], 0.1)
    to_b = chain.models_to(chain.take())["b"]
    assert chain.frame("b", chain.tasks["b"], 100.0)
    to_c = chain.models_to(chain.take())["c"]
    for device in "ac":
        chain.report(device)  # b's own report comes too late to change anything
    assert chain.frame("c", chain.tasks["c"], 0.2)
    result = chain.manager.result()

    # Assert: c got a's model (b's input), the chain ends on c's, b is refused, not credited
    assert np.allclose(to_b, 0.1) and np.allclose(to_c, 0.1)
    assert chain.manager.done and np.allclose(result.final_weights, 0.2)
    assert result.refused == ("b",) and result.skipped == ()
    assert [m.client_id for m in result.members] == ["a", "c"]


def test_the_manager_clips_a_boosted_hand_off() -> None:
    chain = _relay_chain(HopBound(1.0, 10.0, 3.0))
    assert chain.frame("a", chain.tasks["a"], 5.0 / np.sqrt(N))  # norm 5: clipped to 3
    to_b = chain.models_to(chain.take())["b"]
    assert np.linalg.norm(to_b) == pytest.approx(3.0, rel=1e-5)
    assert chain.manager.clipped == ["a"]


def test_a_refused_output_or_a_failure_ends_the_members_wait_at_once() -> None:
    # a relayed chain: a's output refused (NaN, by the coordinator) -> b gets the start model now
    chain = _relay_chain(None)
    assert chain.manager.on_refused("a", chain.tasks["a"], "its output was refused (NaN)", chain.now)
    to_b = chain.models_to(chain.take())["b"]
    assert np.allclose(to_b, 0.0) and chain.now == 0.0  # no deadline passed
    assert chain.manager.result().refused == ("a",)
    # not a's task, or not its turn: nothing happens
    assert not chain.manager.on_refused("a", "other-task", "x", chain.now)
    assert not chain.manager.on_refused("c", chain.tasks["c"], "x", chain.now)
