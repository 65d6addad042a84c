"""The one round driver: the same seed and plan give the same models in simulation and
on boards (FedAvg, FedGSP with direct and relay hand-offs, IFCA, the codecs).

"Boards" is covey's real coordinator and agent code either way: over a real mosquitto
with agent processes (one run per hand-off kind, and the silent members, whose boards
run scripts of their own), or in this process over the loopback broker
(``server/loopback.py``), which is the same code without the network and answers in
seconds."""

from __future__ import annotations

from typing import Any

import pytest

from server.backend import RoundRecord
from server.fleet import REPO
from server.lab.equivalence import run_both
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.slow]
MOSQUITTO = pytest.mark.broker
TRAIN = TrainConfig(epochs=1, batch_size=5, lr=0.01)
CASES = {
    "fedavg": ("direct", lambda: make_strategy("fedavg", train=TRAIN, clients_per_round=4)),
    "fedgsp_direct": (
        "direct",
        lambda: make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=1.0, beta=2, kappa=1.0),
    ),
    "fedgsp_relay": (
        "relay",
        lambda: make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=1.0, beta=2, kappa=1.0),
    ),
    "ifca": ("direct", lambda: make_strategy("ifca", train=TRAIN, n_groups=2, clients_per_round=4)),
}


def _boards(request: pytest.FixtureRequest, where: str) -> dict[str, Any]:
    """run_both's arguments for boards over ``where``: "mosquitto" or "loopback"."""
    if where == "mosquitto":
        broker = request.getfixturevalue("broker")
        return {"host": broker.host, "port": broker.port, "boards": "mqtt"}
    return {"host": "loopback", "port": 0, "boards": "loopback"}


@pytest.mark.parametrize(
    ("case", "where"),
    [(case, "loopback") for case in sorted(CASES)]
    + [pytest.param(case, "mosquitto", marks=MOSQUITTO) for case in ("fedgsp_direct", "fedgsp_relay")],
)
def test_simulation_and_boards_give_the_same_models(
    request: pytest.FixtureRequest, tmp_path, case: str, where: str
) -> None:
    from covey.paths import ensure_model

    # Prepare
    handoff, make = CASES[case]

    # Execute
    result = run_both(
        make,
        root=femnist_root(),
        model_path=ensure_model("mlp_femnist"),
        work=tmp_path,
        run=f"eq-{case.replace('_', '')}",
        rounds=3,
        handoff=handoff,
        **_boards(request, where),
    )

    # Assert
    assert result.max_abs_diff <= 1e-5, result.max_abs_diff
    assert result.accuracy_diff <= 1e-9
    assert [r.federated_accuracy for r in result.sim] == pytest.approx([r.federated_accuracy for r in result.mqtt])
    assert all(r.trained == r.participants and r.skipped == 0 for r in result.mqtt)
    if case.startswith("fedgsp"):
        assert all(r.handoff == {handoff: r.n_groups} for r in result.mqtt)


def test_int8_deltas_give_the_same_models_both_ways_and_accuracy_close_to_fp32(request, tmp_path) -> None:
    """FedAvg with ``--codec int8`` completes over MQTT, matches the simulator running the
    same codec code (downlink deltas included), moves about 4x fewer upload bytes than
    float32 and its accuracy stays close to float32's."""
    from covey.paths import ensure_model

    # Prepare
    handoff, make = CASES["fedavg"]
    model = ensure_model("mlp_femnist")

    # Execute
    result = run_both(
        make,
        root=femnist_root(),
        model_path=model,
        work=tmp_path,
        run="eq-int8",
        rounds=3,
        handoff=handoff,
        codec="int8",
        **_boards(request, "loopback"),
    )
    fp32 = _simulated(make, model, rounds=3)

    # Assert
    assert all(r.trained == r.participants and r.skipped == 0 and not r.dropped for r in result.mqtt)
    assert result.max_abs_diff <= 1e-5, result.max_abs_diff
    assert abs(result.mqtt[-1].federated_accuracy - fp32[-1].federated_accuracy) <= 0.02
    assert fp32[-1].extra["wire_bytes_up"] / result.sim[-1].extra["wire_bytes_up"] >= 3.8
    # round 1: no device holds a model yet; each gets the whole start model as q8, 8-bit blocks
    # (fp16 would be 2x): the boards' models equal the simulator's, so they decoded q8 too
    assert fp32[0].extra["wire_bytes_down"] / result.sim[0].extra["wire_bytes_down"] >= 3.5
    # by the last round every device answered before: start models go as deltas (server/downlink.py)
    assert fp32[-1].extra["wire_bytes_down"] / result.sim[-1].extra["wire_bytes_down"] >= 3.5


def _simulated(make, model, *, rounds: int) -> list[RoundRecord]:  # type: ignore[no-untyped-def]
    """The same run as :func:`run_both`'s simulation, with float32 on the wire."""
    from device.data import read_leaf
    from server.fleet import leaf_writers
    from server.simulation.datasets import ClientData
    from server.simulation.engine import Simulation

    root = femnist_root()
    writers = leaf_writers(root, 6)
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    fed = {f"dev{i:03d}": ClientData(train[w], test[w]) for i, w in enumerate(writers)}
    return Simulation(make(), fed, model, seed=3, federated_eval_every=1).run(rounds)


@pytest.mark.parametrize(("handoff", "codec"), [("auto", "int8"), ("direct", "int8"), ("auto", "int4")])
def test_delta_chains_relay_deltas_and_give_the_same_models_both_ways(
    request, tmp_path, handoff: str, codec: str
) -> None:
    """FedGSP with ``--codec int8`` and the default hand-off mode: every chain is relayed
    through its manager (the hand-offs travel as int8 deltas, up and down), the
    simulator relays them the same way and ends with the same models, the upload bytes
    (hand-offs included) fall about 4x against float32 and accuracy stays close. With
    ``--handoff direct`` the hand-offs go device to device as fp16, in the simulator too.
    ``--codec int4`` relays 4-bit deltas: twice as few bytes again, the same models both
    ways."""
    from covey.paths import ensure_model

    # Prepare
    _, make = CASES["fedgsp_relay"]
    model = ensure_model("mlp_femnist")

    # Execute
    result = run_both(
        make,
        root=femnist_root(),
        model_path=model,
        work=tmp_path,
        run=f"eq-{codec}gsp{handoff}",
        rounds=3,
        handoff=handoff,
        codec=codec,
        **_boards(request, "loopback"),
    )
    fp32 = _simulated(make, model, rounds=3)

    # Assert
    assert all(r.trained == r.participants and r.skipped == 0 and not r.dropped for r in result.mqtt)
    mode = "relay" if handoff == "auto" else handoff
    assert all(r.handoff == {mode: r.n_groups} for r in result.mqtt)
    assert any(r.participants > r.n_groups for r in result.mqtt)  # some chain has a hand-off
    assert result.max_abs_diff <= 1e-5, result.max_abs_diff
    # close to float32: the loss within 1 %. After 3 rounds at about 20 % accuracy on 108 test
    # images, accuracy moves by several images with any change of rounding: simulated over
    # seeds 0-5 the codecs' runs differed from float32 by 0-3 images (relayed int8, int4) and
    # 0-7 (int8 with fp16 hand-offs), and making the MLP's first layer deferred (45dfea3,
    # float rounding only) moved this seed's direct int8 run from within 2 images to 4. So accuracy
    # is held to 8 images, and the loss carries the comparison.
    assert abs(result.mqtt[-1].federated_loss / fp32[-1].federated_loss - 1) <= 0.01
    assert abs(result.mqtt[-1].federated_accuracy - fp32[-1].federated_accuracy) <= 8 / 108
    up = sum(r.extra["wire_bytes_up"] for r in fp32) / sum(r.extra["wire_bytes_up"] for r in result.sim)
    if codec == "int4":
        assert up >= 7.6, up  # at most half a byte per value
    else:
        assert up >= 3.8 if mode == "relay" else 1.9 <= up < 2.5, up  # direct hand-offs: fp16


@MOSQUITTO
@pytest.mark.parametrize("codec", ["int8"])
def test_direct_chains_with_silent_members_give_the_same_models_both_ways(broker, tmp_path, codec: str) -> None:
    """(One codec: the simulator runs the coordinator's own managers, so what is left to
    check here is the agents' side against the virtual devices', and int8 exercises more
    of it than fp16: a forwarded model as a downlink delta, held for the next round.)

    Round 1 of this FedGSP run chains dev002 → dev004 → dev001 and dev005 → dev003 →
    dev000, with direct hand-offs. dev004, in the middle, and dev000, at the end, never
    answer. On boards the manager skips each at its deadline, has its predecessor send
    its output again as float32, and forwards it to dev001 itself (an int8 run: as a
    downlink delta or q8, which dev001 then holds) or keeps it as the chain's model
    (dev003's output, unrounded). The simulator runs the same steps: the same models
    both ways, in round 2 too (whose start models are deltas against what round 1 left
    on each device). Before, it handed models on as fp16 past a silent member."""
    from covey.paths import ensure_model

    # Prepare
    _, make = CASES["fedgsp_direct"]
    silent = {d: REPO / "tests" / "mqtt" / "silent_agent.py" for d in ("dev004", "dev000")}

    # Execute
    result = run_both(
        make,
        root=femnist_root(),
        model_path=ensure_model("mlp_femnist"),
        host=broker.host,
        port=broker.port,
        work=tmp_path,
        run=f"eq-silent-{codec}",
        rounds=2,
        handoff="direct",
        codec=codec,  # type: ignore[arg-type]
        silent=silent,
        deadline_s=10.0,
    )

    # Assert: the plan had the silent members where this test says, both skipped each round
    assert [(r.participants, r.trained, r.skipped) for r in result.mqtt] == [(6, 4, 2), (6, 4, 2)]
    assert result.mqtt[0].n_groups == 2 and result.mqtt[0].handoff == {"direct": 2}
    assert result.max_abs_diff <= 1e-5, result.max_abs_diff
    # the records say the same both ways: the plan, who was skipped, what was sent again
    assert [r.skipped_ids for r in result.mqtt] == [["dev000", "dev004"]] * 2
    assert [r.plan for r in result.sim] == [r.plan for r in result.mqtt]
    assert [r.skipped_ids for r in result.sim] == [r.skipped_ids for r in result.mqtt]
    resends = [r.extra.get("resends") for r in result.mqtt]
    sim_resends = [r.extra.get("resends") for r in result.sim]
    assert resends[0] == 2 and sim_resends == resends, (resends, sim_resends)  # round 1: one per silent member
    for way in ("sent", "received"):  # the coordinator's link carried the same model payloads
        mqtt_bytes = [r.extra[f"server_bytes_{way}"] for r in result.mqtt]
        assert [r.extra[f"server_bytes_{way}"] for r in result.sim] == mqtt_bytes and min(mqtt_bytes) > 0, way
    assert [r.federated_accuracy for r in result.sim] == pytest.approx([r.federated_accuracy for r in result.mqtt])
