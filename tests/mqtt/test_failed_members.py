"""A member whose output is refused, or whose training fails, costs the round nothing
but itself: its group goes on without it at once, not at its deadline.

Faults (issue 26, 7): a member whose upload was refused (NaN) was still waited for until
its deadline (12 rounds took 363 s instead of 27 s); training that diverged on a device
was dropped there and never reported. Here the deadline is 10 minutes: a round that
waited for it would not finish within the test's timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.hops import HOP_REASON
from server.lab.poisoning import POISONER, on_boards
from server.screening import ScreeningConfig
from server.strategies import make_strategy
from server.strategies.base import TrainConfig
from tests.mqtt.conftest import femnist_root

pytestmark = [pytest.mark.broker, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
TRAIN = TrainConfig(1, 10, 0.003)
ROUNDS = 2
N = 4


def _run(broker, femnist_eval, tmp_path, make, script: str, run: str):  # type: ignore[no-untyped-def]
    from covey.paths import ensure_model

    return on_boards(
        make,
        root=femnist_root(),
        model_path=ensure_model("mlp_femnist"),
        eval_data=femnist_eval,
        rounds=ROUNDS,
        n_devices=N,
        seed=1,
        screening=ScreeningConfig(),  # on: --handoff auto relays each chain hand-off
        poisoner_script=HERE / script,
        scale=float("nan"),
        host=broker.host,
        port=broker.port,
        work=tmp_path,
        run=run,
        deadline_s=600.0,
    )


def test_a_nan_upload_ends_its_members_wait_at_once(broker, femnist_eval, tmp_path) -> None:
    # Execute: FedAvg, every device every round; the poisoner's model is all NaN
    make = lambda: make_strategy("fedavg", train=TRAIN, clients_per_round=N)  # noqa: E731
    outcome = _run(broker, femnist_eval, tmp_path, make, "poisoning_agent.py", "nan-member")

    # Assert: refused each round, nobody skipped, the others aggregated
    for rec in outcome.records:
        assert rec.skipped == 0 and rec.trained == N - 1, rec
        assert rec.dropped.get(HOP_REASON) == 1 and rec.rejected.get(POISONER, 0) >= 1
    assert outcome.records[-1].server_accuracy > 0.05


def test_a_member_whose_training_diverges_says_so_and_its_chain_goes_on(broker, femnist_eval, tmp_path) -> None:
    # Execute: FedGSP, one chain of four with relayed hand-offs; dev000's training always diverges
    make = lambda: make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=0.0, beta=1, kappa=1.0)  # noqa: E731
    outcome = _run(broker, femnist_eval, tmp_path, make, "diverging_agent.py", "diverging")

    # Assert: its failure report ended its turn at once; the other three trained
    for rec in outcome.records:
        assert rec.skipped == 0 and rec.trained == N - 1, rec
        assert rec.dropped.get(HOP_REASON) == 1 and rec.rejected.get(POISONER) == 1
    logs = (tmp_path / "logs" / f"{POISONER}.log").read_text()
    assert logs.count("told the server") == ROUNDS
