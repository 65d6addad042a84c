"""Noisy uplinks (issue 29): DSC's channel model in the simulator, ``--channel awgn``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from covey.cli import main
from device.errors import ConfigError
from server.execution.group_model import group_model
from server.simulation.channel import NoisyUplinks, leader_of, received
from server.simulation.config import SimulationConfig
from server.strategies.base import GroupPlan, GroupResult, MemberResult, RoundPlan

REPO = Path(__file__).resolve().parents[3]
IDS = ("a", "b", "c")
START = np.zeros(400, np.float32)


def updates(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.normal(0.0, 0.1, 400).astype(np.float32) for c in IDS}


def dsc_plan() -> RoundPlan:
    group = GroupPlan(0, IDS, "parallel", "global", mean_only=True, group_rule="dsc_angle")
    return RoundPlan(1, (group,), {"global": START})


def members(models: dict[str, np.ndarray]) -> tuple[MemberResult, ...]:
    return tuple(MemberResult(c, 100 * (i + 1), 1.0, START + models[c], norm=1.0) for i, c in enumerate(IDS))


def test_what_arrives_carries_noise_of_the_signals_power_over_the_snr() -> None:
    rng = np.random.default_rng(0)
    sent = rng.normal(0.0, 0.5, 200_000)
    got = received(sent, 10.0, np.random.default_rng(1))
    noise_power = float(np.mean((got - sent) ** 2))
    assert noise_power == pytest.approx(np.mean(sent**2) / 10.0, rel=0.02)
    np.testing.assert_array_equal(received(sent, float("inf"), rng), sent.astype(np.float32))


def test_the_leader_is_the_member_best_linked_to_the_others() -> None:
    snr = np.array([[20.0, 5.0, 0.0], [5.0, 20.0, 25.0], [0.0, 25.0, 20.0]])
    assert leader_of(IDS, {c: i for i, c in enumerate(IDS)}, snr) == "b"  # (5 + 25) / 2 beats 12.5 and 2.5
    assert leader_of(("c",), {c: i for i, c in enumerate(IDS)}, snr) == "c"


def test_a_group_of_noiseless_links_sends_its_leaders_exact_aggregate() -> None:
    models = updates()
    result = GroupResult(0, members(models))
    channel = NoisyUplinks(IDS, np.full((3, 3), np.inf), np.random.default_rng(0))

    (out,) = channel.apply(dsc_plan(), [result])

    # Assert: one model, the angle-weighted aggregate, the members listed without models
    expected = group_model(result, "dsc_angle", START)
    assert expected is not None and out.group_mean is not None
    np.testing.assert_allclose(out.group_mean, expected, atol=1e-6)
    assert all(m.weights is None for m in out.members) and out.managed_by == "leader a"  # equal links: the first
    assert [m.n_samples for m in out.members] == [100, 200, 300]


def test_a_poor_link_to_the_leader_corrupts_that_members_share_only() -> None:
    # Prepare: b leads; a's link to b is at -5 dB (then 30 dB), c's at 40 dB, b's to the server noiseless
    models = updates()
    snr = np.array([[np.inf, -5.0, -20.0], [-5.0, np.inf, 40.0], [-20.0, 40.0, np.inf]])
    result = GroupResult(0, members(models))
    noisy_a = NoisyUplinks(IDS, snr, np.random.default_rng(0)).apply(dsc_plan(), [result])[0]
    snr[0, 1] = snr[1, 0] = 30.0
    clean_a = NoisyUplinks(IDS, snr, np.random.default_rng(0)).apply(dsc_plan(), [result])[0]
    assert noisy_a.managed_by == clean_a.managed_by == "leader b"
    exact = group_model(result, "dsc_angle", START)

    # Assert: the -5 dB link moves the aggregate far more than 40 dB links do
    assert exact is not None and noisy_a.group_mean is not None and clean_a.group_mean is not None
    far, near = np.linalg.norm(noisy_a.group_mean - exact), np.linalg.norm(clean_a.group_mean - exact)
    assert far > 20 * near > 0


def test_members_of_other_parallel_groups_each_cross_their_own_server_link() -> None:
    models = updates()
    plan = RoundPlan(1, (GroupPlan(0, IDS, "parallel", "global"),), {"global": START})
    snr = np.diag([np.inf, 0.0, np.inf])  # b's server link at 0 dB: noise as strong as its update
    (out,) = NoisyUplinks(IDS, snr, np.random.default_rng(0)).apply(plan, [GroupResult(0, members(models))])
    got = {m.client_id: m for m in out.members}
    np.testing.assert_allclose(got["a"].weights, START + models["a"], atol=1e-7)
    moved = np.asarray(got["b"].weights) - (START + models["b"])
    assert float(np.mean(moved**2)) == pytest.approx(float(np.mean(models["b"] ** 2)), rel=0.3)
    assert all(m.norm is None for m in out.members)  # screening must measure what arrived


def test_a_channel_needs_a_topology_and_a_known_kind() -> None:
    with pytest.raises(ConfigError, match=r"channel = awgn \(--channel\) needs a topology"):
        SimulationConfig(channel="awgn")
    with pytest.raises(ConfigError, match="channel must be one of none, awgn"):
        SimulationConfig(channel="rayleigh", topology="x.toml")


POOR_RADIO = """
[[site]]
name = "field"
devices = 12
bandwidth_mbps = 5
snr_db = -10

[[link]]
sites = ["field", "field"]
bandwidth_mbps = 5
snr_db = -10
"""


@pytest.mark.slow
def test_simulate_with_a_noisy_channel_records_it_and_learns_less(tmp_path: Path) -> None:
    """DSC over links at -10 dB (noise ten times each update's power), with and without
    the channel: the same seed, the channel recorded, and the noisy run below the clean."""
    topology = tmp_path / "poor.toml"
    topology.write_text(POOR_RADIO)
    base = ["simulate", "--strategy", "dsc", "--data", "users=12", "--rounds", "6", "--seed", "0"]
    base += ["--topology", str(topology), "--screening", "off"]
    runs = {}
    for channel in ("none", "awgn"):
        out = tmp_path / channel
        assert main([*base, "--channel", channel, "--out", str(out)]) == 0
        doc = json.loads(next(out.glob("*.json")).read_text())
        assert doc["settings"]["channel"]["value"] == channel
        runs[channel] = doc
    assert runs["awgn"]["settings"]["channel"]["source"] == "flag"
    best = {k: r["summary"]["best"] for k, r in runs.items()}
    assert best["awgn"] < best["none"] - 0.05, best
