"""What the simulator counts on the wire for a chain: each frame once as sent
(``down``, ``up``), and the hand-offs a device received from another (``peer``), which
cross the devices' links twice (``wire_radio_bytes``, server/rounds.py)."""

from __future__ import annotations

import numpy as np
import pytest

from server.simulation.datasets import synthetic
from server.simulation.engine import Handoff, VirtualDevices
from server.strategies.base import GroupPlan, RoundPlan, TrainConfig
from tests.server.simulation.frame_sizes import frame_bytes

TRAIN = TrainConfig(epochs=1, batch_size=10, lr=0.05)


def _chain_round(zoo_model, codec: str, handoff: Handoff) -> tuple[dict[str, int], int]:  # type: ignore[no-untyped-def]
    """One round of one chain of four in ``codec``: the round's counts and the frame
    size of one fp16 model."""
    fed = synthetic(1, 1, 4, seed=3)
    sim = VirtualDevices(fed, zoo_model("mclr_synthetic"), codec=codec, handoff=handoff)  # type: ignore[arg-type]
    start = sim.initial_weights()
    plan = RoundPlan(1, (GroupPlan(0, tuple(sorted(fed)), "chain", "m"),), {"m": start}, TRAIN)
    sim.execute(plan, seed=1)
    counts = sim.round_stats().wire_bytes
    sim.close()
    return counts, frame_bytes(np.zeros(start.size, np.float16), "fp16")


def _frames_of(counts: dict[str, int], model: int, **frames: int) -> None:
    """``counts`` holds ``frames[k]`` frames of one model for each ``k``; a header names
    the real task and device ids, so a frame may differ from ``model`` by a few bytes."""
    assert counts.keys() == frames.keys()
    for kind, n in frames.items():
        assert abs(counts[kind] - n * model) <= 16 * n, (kind, counts, model)


def test_a_direct_chain_s_hand_offs_are_sent_once_and_received_once(zoo_model) -> None:
    counts, model = _chain_round(zoo_model, "fp16", "direct")
    # the first member's start model; three hand-offs and the last output, sent; three received
    _frames_of(counts, model, down=1, up=4, peer=3)


def test_relayed_hand_offs_reach_the_next_member_from_the_manager_not_from_a_device(zoo_model) -> None:
    counts, model = _chain_round(zoo_model, "fp16", "relay")
    _frames_of(counts, model, down=4, up=4, peer=0)


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_delta_runs_relay_every_hand_off(zoo_model, codec: str) -> None:
    counts, _ = _chain_round(zoo_model, codec, "auto")
    assert counts["peer"] == 0 and counts["down"] > 0 and counts["up"] > 0, counts
