"""Groups run at a site's edge (issue 28, ``server/edge/``), in one process: the real
coordinator, agents and edge hosts over the loopback broker. (One broker stands for the
room's and the centre's here, so the coordinator also sees the room's boards' outputs
and counts them as duplicates; ``tests/site/test_edge.py`` runs the real bridged
brokers.)"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from device.data import read_leaf
from device.errors import ConfigError, ProtocolError
from device.protocol import (
    FrameCodec,
    FrameExtra,
    LocalTraining,
    Payload,
    Reassembler,
    Topics,
    WireCodec,
    check_weights,
    send_model,
)
from device.protocol.codecs import ErrorFeedback
from server.coordinator.board_backend import BoardBackend
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.downlink import downlinks_for
from server.edge.host import EdgeHost, EdgeSettings
from server.edge.messages import EdgeMember, EdgeReport, EdgeTask, decode_edge, encode_edge
from server.edge.proxy import EdgeBook, EdgeGroupProxy, model_key
from server.edge.state import EdgeState
from server.edge.uplink import encode_upload
from server.execution.group_model import group_model
from server.execution.manager import GroupManager
from server.fleet import leaf_writers
from server.lab.edges import federation, max_abs_diff, run_with_edges, sim_vs_edges
from server.loopback import LoopbackBroker, LoopbackFleet
from server.paths import ensure_model
from server.screening import ScreeningConfig, screen_results
from server.simulation.engine import Simulation
from server.strategies import make_strategy
from server.strategies.base import (
    EdgeMean,
    GroupPlan,
    GroupResult,
    MemberResult,
    RoundPlan,
    Strategy,
    TrainConfig,
    returned,
)
from server.strategies.clustered import GroupModelStrategy
from tests.mqtt.conftest import femnist_root

IDS = [f"dev{i:03d}" for i in range(6)]
EDGES = {"a": tuple(IDS[:3]), "b": tuple(IDS[3:])}


def hierfavg() -> Strategy:
    return make_strategy("hierfavg", tau2=2, train=TrainConfig(1, 10, 0.05, max_steps=5))


def fedgsp() -> Strategy:
    return make_strategy("fedgsp", train=TrainConfig(1, 10, 0.05, max_steps=5))


def dsc() -> Strategy:
    return make_strategy("dsc", clients_per_round=len(IDS), train=TrainConfig(1, 10, 0.05, max_steps=5))


@pytest.mark.slow
@pytest.mark.parametrize("make", [hierfavg, fedgsp, dsc], ids=["hierfavg", "fedgsp", "dsc"])
def test_the_simulator_given_the_site_gives_the_edges_models(make: Callable[[], Strategy], tmp_path: Path) -> None:
    # Prepare, execute: the simulator told the site's edges, and the boards through them
    # (the simulator gives the central run's models: tests/mqtt/test_equivalence.py).
    # DSC groups by links and labels, not by room: with every board behind one edge, each
    # of its groups is the edge's to aggregate (Eq. 2 and 4 there, Eq. 3 centrally)
    edges = {"a": tuple(IDS)} if make is dsc else EDGES
    diff, hosts = sim_vs_edges(
        make, federation(femnist_root(), IDS), ensure_model("mlp_femnist"), tmp_path, edges=edges, rounds=3
    )

    # Assert: groups ran at the edges (HierFAVG's every one: a group per edge and round;
    # DSC's every one) and the models agree (fp32: the aggregates differ only by rounding;
    # a chain not at all)
    done = [h.groups_done for h in hosts]
    if make is hierfavg:
        assert done == [3, 3], done
    elif make is dsc:
        assert done[0] >= 3, done
    else:
        assert min(done) > 0, done
    assert diff <= (0.0 if make is fedgsp else 1e-5)


@pytest.mark.slow
def test_a_group_that_spans_rooms_is_averaged_at_each_room_s_edge_with_the_same_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: FedAvg-IC on data alone (FedAvg-I), grouping by data, not by room: 2 groups
    # over 6 boards in 2 rooms. Its k-medoids starts from the RTTs the boards' registration
    # pings measured, which differ from run to run and which the simulator has none of, so
    # the boards' run is given none either: both group the same, and the models can agree
    def make() -> Strategy:
        train = TrainConfig(1, 10, 0.05, max_steps=5)
        # the descent's groups (the balanced ones happen to be the rooms here, and the test
        # needs a group in both rooms)
        return make_strategy("fedavg_ic", n_groups=2, tau2=2, alpha_comm=0.0, train=train, assignment="descent")

    monkeypatch.setattr(BoardBackend, "distance_matrix", lambda self: None)

    data = federation(femnist_root(), IDS)
    model = ensure_model("mlp_femnist")
    simulated = make()
    Simulation(simulated, dict(data), model, seed=3, federated_eval_every=0, edges=EDGES).run(3)

    # Execute
    edged = make()
    _, hosts = run_with_edges(edged, data, model, tmp_path, edges=EDGES, rounds=3)

    # Assert: a group had members in both rooms, the edges still averaged their rooms'
    # parts of it, and the models are the simulator's (a mean of the parts' means)
    assert isinstance(edged, GroupModelStrategy)
    rooms = {
        g: {next(e for e, ds in EDGES.items() if c in ds) for c, h in edged.assignment.items() if h == g}
        for g in set(edged.assignment.values())
    }
    assert any(len(r) == 2 for r in rooms.values()), rooms
    assert all(h.groups_done > 0 for h in hosts), [h.groups_done for h in hosts]  # both rooms' parts
    assert max_abs_diff(simulated, edged) <= 1e-5


def test_dscs_group_aggregated_at_the_edge_gives_the_global_model_of_its_members() -> None:
    # Prepare: two DSC groups' members, and the same start model
    rng = np.random.default_rng(0)
    start = rng.normal(0, 1, 50).astype(np.float32)
    groups = [[start + rng.normal(0, 0.1, 50).astype(np.float32) for _ in range(k)] for k in (3, 2)]
    samples = [[5, 9, 2], [7, 4]]

    def members(g: int) -> tuple[MemberResult, ...]:
        return tuple(
            MemberResult(f"d{g}{i}", n, 1.0, w) for i, (n, w) in enumerate(zip(samples[g], groups[g], strict=True))
        )

    def global_model(results: list[GroupResult]) -> np.ndarray:
        strategy = dsc()
        strategy.global_weights = start.copy()
        plans = tuple(GroupPlan(g, tuple(m.client_id for m in members(g)), "parallel", "global") for g in (0, 1))
        strategy.aggregate(1, RoundPlan(1, plans, {"global": start}), results)
        assert strategy.global_weights is not None
        return strategy.global_weights

    # Execute: centrally from every member; with group 0 aggregated at an edge (its
    # members' models stay there, only their counts come up)
    central = global_model([GroupResult(g, members(g)) for g in (0, 1)])
    at_edge = group_model(GroupResult(0, members(0)), "dsc_angle", start)
    assert at_edge is not None
    counts = tuple(replace(m, weights=None) for m in members(0))
    edged = global_model([GroupResult(0, counts, group_mean=at_edge, managed_by="a"), GroupResult(1, members(1))])

    # Assert: the same global model (Eq. 3 over Eq. 2/4's group models), and not the
    # sample-weighted mean a HierFAVG edge sends
    np.testing.assert_allclose(edged, central, atol=1e-6)
    mean = group_model(GroupResult(0, members(0)))
    assert mean is not None and np.abs(mean - at_edge).max() > 1e-4


def test_each_edge_s_part_of_a_split_group_weighs_as_its_members_bounded_samples() -> None:
    # Prepare: a group split between edges a and b and the coordinator (c1); a1's claim
    # was bounded to 100 samples by the round driver (review: a summed sample count
    # stored with the mean would have kept the raw claim, 10^9)
    a_mean, b_mean, c1 = (np.full(4, v, np.float32) for v in (1.0, 2.0, 3.0))
    r = GroupResult(
        0,
        (
            MemberResult("a1", 100, 1.0),
            MemberResult("a2", 50, 1.0),
            MemberResult("b1", 30, 1.0),
            MemberResult("b2", 20, 1.0),
            MemberResult("c1", 10, 1.0, c1),
        ),
        edge_means=(EdgeMean("a", ("a1", "a2"), a_mean), EdgeMean("b", ("b1", "b2"), b_mean)),
    )

    # Execute
    out = {m.client_id: (m.n_samples, w) for m, w in returned([r])}

    # Assert: one member per edge with its members' samples, and the member run here
    assert {k: n for k, (n, _) in out.items()} == {"c1": 10, "group0@a": 150, "group0@b": 50}
    assert out["group0@a"][1] is a_mean


def test_a_lying_edge_costs_only_its_own_part_of_a_split_group() -> None:
    # Prepare: honest members and edge a's honest mean; edge b's "mean" 50x theirs
    rng = np.random.default_rng(1)
    start = np.zeros(100, np.float32)
    honest = [start + rng.normal(0, 0.1, 100).astype(np.float32) for _ in range(4)]
    plan = RoundPlan(1, (GroupPlan(0, ("a1", "a2", "b1", "b2", "c1", "c2"), "parallel", "g"),), {"g": start})
    members = (
        *(MemberResult(d, 10, 1.0) for d in ("a1", "a2", "b1", "b2")),
        MemberResult("c1", 10, 1.0, honest[0]),
        MemberResult("c2", 10, 1.0, honest[1]),
    )
    parts = (EdgeMean("a", ("a1", "a2"), (honest[2] + honest[3]) / 2), EdgeMean("b", ("b1", "b2"), 50 * honest[0]))
    r = GroupResult(0, members, edge_means=parts)

    # Execute
    screened = screen_results(plan, [r], ScreeningConfig())

    # Assert: b's mean refused and blamed on b's members; a's mean and the members kept
    (kept,) = screened.results
    assert [p.edge for p in kept.edge_means] == ["a"]
    assert [x.devices for x in screened.rejections] == [("b1", "b2")]
    assert {m.client_id for m, _ in returned([kept])} == {"c1", "c2", "group0@a"}


def test_a_group_mean_counts_as_one_member_with_its_members_samples() -> None:
    mean = np.ones(4, np.float32)
    r = GroupResult(0, (MemberResult("a", 3, 1.0), MemberResult("b", 1, 2.0)), group_mean=mean, managed_by="lab")
    ((member, weights),) = returned([r])
    assert (member.client_id, member.n_samples, member.train_loss) == ("group0@lab", 4, 1.25)
    assert weights is mean


def test_a_lying_edges_group_mean_is_screened_like_a_member() -> None:
    # Prepare: four honest members' updates at one group, and an edge's "mean" 50x theirs
    rng = np.random.default_rng(0)
    start = np.zeros(100, np.float32)
    honest = [start + rng.normal(0, 0.1, 100).astype(np.float32) for _ in range(4)]
    plan = RoundPlan(
        2,
        (
            GroupPlan(0, ("a", "b", "c", "d"), "parallel", "m"),
            GroupPlan(1, ("e", "f"), "parallel", "m", mean_only=True),
        ),
        {"m": start},
    )
    members = tuple(MemberResult(c, 10, 1.0, w) for c, w in zip("abcd", honest, strict=True))
    lying = GroupResult(1, (MemberResult("e", 10, 1.0), MemberResult("f", 10, 1.0)), group_mean=50 * honest[0])
    results = [GroupResult(0, members), lying]

    # Execute
    screened = screen_results(plan, results, ScreeningConfig())

    # Assert: the edge's mean is refused (its members stay listed), the honest members kept
    assert [r.devices for r in screened.rejections] == [("e", "f")]
    assert screened.results[1].group_mean is None and len(screened.results[1].members) == 2
    assert all(m.weights is not None for m in screened.results[0].members)


def test_edge_messages_refuse_what_is_wrong() -> None:
    task = EdgeTask(2, 1, ("a",), "parallel", "e1", LocalTraining(1, 10, 0.01), 60.0, 3, 900_000, "relay", "0" * 64)
    assert decode_edge(encode_edge(task, "run"), "run") == task
    with pytest.raises(ProtocolError, match="for run 'run', not 'other'"):
        decode_edge(encode_edge(task, "run"), "other")
    with pytest.raises(ProtocolError, match="not UTF-8 JSON"):
        decode_edge(b"\xff{", "run")
    bad = encode_edge(EdgeReport(2, 1, "e1", "done", (EdgeMember("a", 5, 0.5),)), "run").replace(b"0.5", b"1e999")
    with pytest.raises(ProtocolError):
        decode_edge(bad, "run")


@pytest.mark.slow
def test_an_edge_that_never_answers_costs_only_its_rooms_groups(tmp_path: Path) -> None:
    # Prepare: edge "a" says it is online and then does nothing (its host never serves);
    # edge "b" works
    root = femnist_root()
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    fed = {d: (train[w], test[w]) for d, w in zip(IDS, leaf_writers(root, len(IDS)), strict=True)}
    broker, stop = LoopbackBroker(), threading.Event()
    hosts = {
        name: EdgeHost(EdgeSettings("edges", name, devices, "", 0), link_factory=broker.link)
        for name, devices in EDGES.items()
    }
    for host in hosts.values():
        host.connect()
    serving = threading.Thread(target=hosts["b"].serve, args=(stop,), daemon=True)
    serving.start()
    config = CoordinatorConfig("edges", "", 0, tmp_path / "state", seed=3, deadline_s=2, edges=dict(EDGES))

    # Execute
    try:
        with LoopbackFleet(broker, fed, run="edges", state_dir=tmp_path / "agents"):
            records = Coordinator(config, hierfavg(), ensure_model("mlp_femnist"), link_factory=broker.link).run_rounds(
                len(IDS), 2
            )
    finally:
        stop.set()
        serving.join(10)

    # Assert: both rounds ended; the silent edge's three boards were skipped, the others trained
    assert [(r.trained, r.skipped) for r in records] == [(3, 3), (3, 3)]
    assert hosts["b"].groups_done == 2 and hosts["a"].groups_done == 0


def test_the_coordinator_sends_an_edge_the_start_model_once_and_again_when_it_lacks_it() -> None:
    # Prepare: a book with one online edge, recording what the coordinator publishes
    sent: list[str] = []

    def publish(topic: str, data: bytes, retain: bool = False) -> None:
        sent.append(topic)

    book = EdgeBook({"a": frozenset(IDS[:3])}, Topics("edges"), publish, 60.0, 1 << 20, "fp32")
    book.on_status("edge.a", b"online")
    start = np.arange(10, dtype=np.float32)
    group = GroupPlan(0, tuple(IDS[:3]), "parallel", "g0", mean_only=True)

    def proxy(rnd: int) -> GroupManager:
        made = book.manager_for(group, rnd, start, TrainConfig(), task_prefix="e", seed=1, hop=None, handoff="relay")
        assert made is not None
        made.start(0.0)
        return made

    # Execute, assert: round 2 sends the model and the task; round 3 (same start) the task alone
    proxy(2)
    assert sent == ["covey/edges/edge/a/models", "covey/edges/edge/a/tasks"]
    sent.clear()
    third = proxy(3)
    assert sent == ["covey/edges/edge/a/tasks"]

    # Execute, assert: the edge restarted and lacks it: the model and the task go again
    sent.clear()
    missing = EdgeReport(3, 0, "e", "missing_model", model="0" * 64)
    assert third.on_edge("edge.a", missing, None, 1.0)
    assert sent == ["covey/edges/edge/a/models", "covey/edges/edge/a/tasks"]

    # Execute, assert: a report naming a board of the group twice, or another's, is refused
    for members in ((EdgeMember(IDS[0], 5, 0.1), EdgeMember(IDS[0], 5, 0.1)), (EdgeMember(IDS[4], 5, 0.1),)):
        with pytest.raises(ProtocolError, match="reported members"):
            third.on_edge("edge.a", EdgeReport(3, 0, "e", "done", members), None, 1.0)
    assert not third.done

    # A group with a board behind no edge, or an edge offline, runs at the coordinator
    assert (
        book.manager_for(
            GroupPlan(1, (IDS[0], IDS[4]), "parallel", "g1", mean_only=True),
            3,
            start,
            TrainConfig(),
            task_prefix="e",
            seed=1,
            hop=None,
            handoff="relay",
        )
        is None
    )
    book.on_status("edge.a", b"offline")
    assert book.manager_for(group, 4, start, TrainConfig(), task_prefix="e", seed=1, hop=None, handoff="relay") is None


def test_group_means_do_not_lower_the_bound_members_are_held_to_later() -> None:
    # Prepare: a round whose groups all ran at edges (their means are shorter than any
    # member's update: averaging shrinks them)
    start = np.zeros(50, np.float32)
    plan = RoundPlan(
        3, tuple(GroupPlan(g, (f"d{g}a", f"d{g}b"), "parallel", "m", mean_only=True) for g in range(3)), {"m": start}
    )
    results = [
        GroupResult(
            g, (MemberResult(f"d{g}a", 10, 1.0), MemberResult(f"d{g}b", 10, 1.0)), group_mean=start + 0.01 * (g + 1)
        )
        for g in range(3)
    ]

    # Execute
    screened = screen_results(plan, results, ScreeningConfig())

    # Assert: every mean kept, and none of them entered the members' history
    assert not screened.rejections and all(r.group_mean is not None for r in screened.results)
    assert screened.accepted["member"] == []


def test_an_edges_state_comes_back_whole_and_refuses_what_was_altered(tmp_path: Path) -> None:
    # Prepare: a task in flight and a finished report, with their models
    state = EdgeState(tmp_path / "state")
    start, done = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
    task = EdgeTask(
        2, 0, ("a", "b"), "chain", "e1", LocalTraining(1, 10, 0.01), 60.0, 3, 900_000, "relay", model_key(start)
    )
    report = EdgeReport(1, 0, "e0", "done", (EdgeMember("a", 5, 0.5),), model=model_key(done))
    state.save_model(start)
    state.save_model(done)
    state.save([task], [(report, model_key(done))])

    # Execute, assert: what was saved comes back, models checked against their names
    tasks, finished = EdgeState(tmp_path / "state").load()
    assert tasks == [task]
    assert finished[0][0] == report and np.array_equal(finished[0][1], done)
    assert np.array_equal(state.load_model(task.model), start)

    # Execute, assert: a model file altered by hand is left out; a broken list is refused
    np.save(tmp_path / "state" / "models" / f"{task.model}.npy", start + 1, allow_pickle=False)
    assert state.load_model(task.model) is None
    (tmp_path / "state" / "edge.json").write_text("{not json")
    with pytest.raises(ConfigError, match="remove it to start the edge afresh"):
        state.load()


def test_a_report_that_comes_again_after_a_reconnect_is_a_duplicate() -> None:
    # Prepare: a group run by edge "a", done once its report came (nobody's model came back)
    book = EdgeBook({"a": frozenset(IDS[:3])}, Topics("edges"), lambda *a, **k: None, 60.0, 1 << 20, "fp32")
    book.on_status("edge.a", b"online")
    group = GroupPlan(0, tuple(IDS[:3]), "parallel", "g0", mean_only=True)
    proxy = book.manager_for(
        group, 2, np.zeros(4, np.float32), TrainConfig(), task_prefix="e", seed=1, hop=None, handoff="relay"
    )
    assert proxy is not None
    proxy.start(0.0)
    report = EdgeReport(2, 0, "e", "done", skipped=tuple(IDS[:3]))
    assert proxy.on_edge("edge.a", report, None, 1.0) and proxy.done

    # Execute, assert: the same report again (the bridge delivers at least once) is known, not used
    assert not proxy.on_edge("edge.a", report, None, 2.0)
    assert proxy.knows_edge("edge.a", report)
    assert not proxy.knows_edge("edge.b", report)
    assert not proxy.knows_edge("edge.a", EdgeReport(3, 0, "e", "done"))


def through_frames(array: np.ndarray, codec: FrameCodec, base: str | None) -> Payload:
    """``array`` as an edge's frames carry it to the coordinator, reassembled."""
    frames: list[bytes] = []

    def publish(topic: str, data: bytes, retain: bool = False) -> None:
        frames.append(data)

    send_model(
        publish,
        "t",
        array,
        kind="result",
        run="edges",
        round=2,
        group=0,
        sender="edge.a",
        codec=codec,
        base=base,
        extra=FrameExtra("e-r2-g0", position=0),
    )
    reassembler, payload = Reassembler(), None
    for frame in frames:
        payload = reassembler.add(frame, sender="edge.a")
    assert payload is not None
    return payload


def test_an_edge_sends_its_group_model_up_in_the_run_s_codec() -> None:
    # Prepare: a group's start and trained models, the start's key as the coordinator holds it
    rng = np.random.default_rng(0)
    start = rng.normal(size=5000).astype(np.float32)
    model = start + rng.normal(scale=0.01, size=5000).astype(np.float32)
    key = model_key(start)

    codecs: list[tuple[WireCodec, str, float]] = [("fp32", "raw", 0.0), ("fp16", "fp16", 1e-3), ("int8", "int8", 1e-3)]
    for codec, frame, at_most in codecs:
        # Execute
        up = encode_upload(model, start, key, codec, ErrorFeedback())

        # Assert: the payload's codec and base; the coordinator decodes exactly the model
        # the edge names (and keeps as the group's next start), within the codec's step
        assert up.codec.startswith(frame), (codec, up.codec)
        assert up.base == (key if codec == "int8" else None)
        payload = through_frames(up.payload, up.codec, up.base)
        assert np.array_equal(check_weights(payload, 5000, {key: start}), up.received)
        assert float(np.max(np.abs(up.received - model))) <= at_most, codec
    assert encode_upload(model, start, key, "int8", ErrorFeedback()).payload.nbytes < model.nbytes / 3

    # What the codec cannot carry goes raw, whole: weights beyond float16's range (one
    # member's huge weight must not sink its group's model), a delta too large to quantise
    huge = model.copy()
    huge[7] = 1e6
    for codec, weights in (("fp16", huge), ("int8", start + np.float32(3e38))):
        up = encode_upload(weights, start - np.float32(3e38) if codec == "int8" else start, key, codec, ErrorFeedback())
        assert up.codec == "raw" and np.array_equal(up.received, weights), codec
        assert np.array_equal(check_weights(through_frames(up.payload, up.codec, up.base), 5000, None), weights)

    # Non-finite weights go as they are, for the coordinator to refuse with the reason
    bad = model.copy()
    bad[3] = np.nan
    up = encode_upload(bad, start, key, "int8", ErrorFeedback())
    assert up.codec == "raw"
    with pytest.raises(ProtocolError, match="NaN"):
        check_weights(through_frames(up.payload, up.codec, up.base), 5000, None)


def test_in_an_int8_run_an_edge_s_members_get_their_next_central_model_whole() -> None:
    # Prepare: an int8 run's book, and a member the coordinator last sent a model it holds
    bases: dict[str, np.ndarray] = {}
    downlinks = downlinks_for("int8", None)
    assert downlinks is not None
    start = np.arange(300, dtype=np.float32)
    down = downlinks.encode(IDS[0], start)
    downlinks.sent(IDS[0], "t1", down.key)
    downlinks.confirm(IDS[0], "t1")
    assert downlinks.base_of(IDS[0]) == down.key
    book = EdgeBook(
        {"a": frozenset(IDS[:3])}, Topics("edges"), lambda *a: None, 60.0, 1 << 20, "int8", bases, downlinks
    )
    book.on_status("edge.a", b"online")
    group = GroupPlan(0, tuple(IDS[:3]), "parallel", "g0", mean_only=True)

    # Execute: the edge runs the member's group
    proxy = book.manager_for(group, 2, start + 1, TrainConfig(), task_prefix="e", seed=1, hop=None, handoff="relay")
    assert proxy is not None
    proxy.start(0.0)

    # Assert: the task says the run's codec; the start is a delta base for the group's
    # model; the member holds what the edge sent it, so its next central model goes whole
    assert isinstance(proxy, EdgeGroupProxy) and proxy.task.codec == "int8"
    assert np.array_equal(bases[model_key(start + 1)], start + 1)
    assert downlinks.base_of(IDS[0]) is None
    assert downlinks.encode(IDS[0], start + 2).base is None


@pytest.mark.slow
@pytest.mark.parametrize(("codec", "share", "within"), [("int8", 0.3, 1e-3), ("int4", 0.16, 5e-3)])
def test_an_int8_run_aggregates_at_its_edges_and_sends_each_group_model_in_its_codec(
    codec: WireCodec, share: float, within: float, tmp_path: Path
) -> None:
    # Prepare: HierFAVG on 6 boards in 2 rooms, fp32 in the simulator
    data, model = federation(femnist_root(), IDS), ensure_model("mlp_femnist")
    simulated = hierfavg()
    Simulation(simulated, dict(data), model, seed=3, federated_eval_every=0, edges=EDGES).run(3)

    # Execute: the same through the edges, models travelling in ``codec``
    edged = hierfavg()
    records, hosts = run_with_edges(edged, data, model, tmp_path, edges=EDGES, rounds=3, codec=codec)

    # Assert: every group ran at its edge with every board, each group model went up as a
    # delta in the codec (int8 at most about a quarter of float32's bytes, int4 an eighth),
    # and the models are the fp32 simulator's within the codec's step
    assert [h.groups_done for h in hosts] == [3, 3]
    assert all(r.trained == 6 and not r.skipped for r in records), records
    assert simulated.global_weights is not None
    n_params = simulated.global_weights.size
    for host in hosts:
        assert host.sent_up_bytes < share * host.groups_done * 4 * n_params, host.sent_up_bytes
    assert max_abs_diff(simulated, edged) <= within
