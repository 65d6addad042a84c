"""Every strategy, driven by the simulation engine over real LiteRT training."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import StrategyError
from server.simulation.datasets import SwapShift, synthetic
from server.simulation.engine import Simulation
from server.strategies import make_strategy, strategy_names
from server.strategies.base import TrainConfig

TRAIN = TrainConfig(epochs=2, batch_size=10, lr=0.01)
SETTINGS = {
    "fedavg": {"clients_per_round": 10},
    "fedprox": {"clients_per_round": 10, "mu": 0.01},
    "fedadagrad": {"clients_per_round": 10, "server_lr": 0.3},
    "fedadam": {"clients_per_round": 10, "server_lr": 0.05},
    "fedyogi": {"clients_per_round": 10, "server_lr": 0.05},
    "fedgsp": {"beta": 3, "kappa": 0.5},
    "naivegsp": {"beta": 3, "kappa": 0.5},
    "naivegsp_icg": {"beta": 3, "kappa": 0.5},
    "dsc": {"clients_per_round": 10, "local_steps": None},  # a whole epoch: the letter's one step learns slowly
    "fedgroup": {"n_groups": 3, "clients_per_round": 10, "alpha": 3, "pretrain_steps": 10},
    "fedgrouprox": {"n_groups": 3, "clients_per_round": 10, "alpha": 3, "pretrain_steps": 10},
    "flexcfl": {"n_groups": 3, "clients_per_round": 10, "alpha": 3, "pretrain_steps": 10},
    "ifca": {"n_groups": 3, "clients_per_round": 10},
    "fesem": {"n_groups": 3, "clients_per_round": 10},
    "fedavg_ic": {"n_groups": 3, "tau1": 20, "tau2": 2},  # 10 rounds: several global aggregations
    "hierfavg": {"n_groups": 3, "tau1": 20, "tau2": 2},
}
# FedAvg-IC's round 1 is one SGD step (Alg. 1 line 1), whose updates its grouping reads:
# with TRAIN's batch of 10 they group poorly (12 % by round 10, against 51 % with the
# paper's Table 4 training: batch 128, η = 0.1, decay 0.99), so it trains as its paper says
PAPER_TRAINING = {"fedavg_ic"}


@pytest.fixture(scope="module")
def model(zoo_model):
    return zoo_model("mclr_synthetic")


def test_every_registered_strategy_has_test_settings() -> None:
    assert sorted(SETTINGS) == strategy_names()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_strategy_trains_and_improves_accuracy(model, name: str) -> None:
    # Prepare
    fed = synthetic(1, 1, 30, seed=0)
    train = None if name in PAPER_TRAINING else TRAIN
    sim = Simulation(make_strategy(name, train=train, **SETTINGS[name]), fed, model, seed=1)

    # Execute: 10 rounds. Synthetic's sizes are lognormal, and the default weight cap
    # (server/claims.py) slows FedAvg-IC's first rounds: 29 % at round 8 (39 % without
    # the cap), 42 % at round 10, both about 49 % at round 12
    records = sim.run(10)

    # Assert
    assert [r.round for r in records] == list(range(1, 11))
    assert records[-1].federated_accuracy > records[0].federated_accuracy
    assert max(r.federated_accuracy for r in records) > 0.3  # chance is 0.1
    assert all(np.isfinite(r.train_loss) for r in records)
    assert all(r.bytes > 0 and r.t_comp_s > 0 and r.t_comm_s > 0 for r in records)


def test_fedgsp_chains_train_each_sampled_client_once_in_growing_groups(model) -> None:
    fed = synthetic(1, 1, 30, seed=2)
    strategy = make_strategy("fedgsp", train=TRAIN, growth="linear", alpha=1.0, beta=2, kappa=1.0)
    sim = Simulation(strategy, fed, model, seed=0)
    sizes = []
    for _ in range(3):
        plan = strategy.plan_round(sim.rnd + 1, sim.driver.context)
        assert all(g.mode == "chain" for g in plan.groups)
        assert len(plan.participants) == len(set(plan.participants)) == 30  # κ = 1: everyone once
        sizes.append(len(plan.groups))
        sim.step()
    assert sizes == [2, 4, 6]  # f(r) = 2 floor(r - 1 + 1)


@pytest.mark.slow
def test_clustered_strategies_score_clients_with_their_group_model(model) -> None:
    fed = synthetic(1, 1, 30, seed=3)
    strategy = make_strategy("fedgroup", train=TRAIN, **SETTINGS["fedgroup"])
    sim = Simulation(strategy, fed, model, seed=0)
    sim.run(3)
    groups = {strategy.group_of(c) for c in fed}
    models = {id(strategy.model_for(c)) for c in fed if strategy.group_of(c) is not None}
    assert len(groups - {None}) >= 2
    assert len(models) >= 2


def test_flexcfl_migrates_clients_under_distribution_shift(model) -> None:
    fed = synthetic(1, 1, 30, seed=4)
    strategy = make_strategy("flexcfl", train=TRAIN, **SETTINGS["flexcfl"])
    sim = Simulation(strategy, fed, model, seed=0, shift=SwapShift(probability=0.3))
    records = sim.run(6)
    assert sum(r.extra.get("shifted_clients", 0) for r in records) > 0
    assert strategy.migrations > 0


@pytest.mark.slow
def test_simulation_is_deterministic_and_independent_of_workers(model) -> None:
    def run(workers: int) -> list[float]:
        fed = synthetic(1, 1, 20, seed=5)
        strategy = make_strategy("fedgsp", train=TRAIN, beta=2, kappa=1.0)
        return [r.federated_accuracy for r in Simulation(strategy, fed, model, seed=7, workers=workers).run(3)]

    assert run(1) == run(1)
    assert run(1) == run(2)


def test_unknown_strategy_and_parameters_are_refused() -> None:
    with pytest.raises(StrategyError, match="unknown strategy 'fedbest'"):
        make_strategy("fedbest")
    with pytest.raises(StrategyError, match="no parameter"):
        make_strategy("fedavg", kappa=0.3)


def test_more_clients_per_round_than_clients_is_refused(model) -> None:
    sim = Simulation(make_strategy("fedavg", clients_per_round=50), synthetic(1, 1, 10), model, seed=0)
    with pytest.raises(StrategyError, match="50 clients per round but only 10"):
        sim.step()


def test_hierfavg_groups_by_network_from_the_first_round(model) -> None:
    """HierFAVG needs no warm-up round: nodes near each other (RTT) form the groups."""
    fed = synthetic(1, 1, 12, seed=6)
    pos = np.repeat([0.0, 50.0, 100.0], 4)  # three sites of four devices
    rtt = np.abs(pos[:, None] - pos[None, :])
    strategy = make_strategy("hierfavg", train=TRAIN, n_groups=3, tau1=5)
    sim = Simulation(strategy, fed, model, seed=0, distance=rtt)

    sim.step()

    ids = sorted(fed)
    groups = [strategy.group_of(c) for c in ids]
    assert [len(set(groups[i : i + 4])) for i in (0, 4, 8)] == [1, 1, 1]
    assert len(set(groups)) == 3


@pytest.mark.parametrize("name", ["ifca", "fesem"])
def test_cluster_models_start_distinct(model, name: str) -> None:
    strategy = make_strategy(name, train=TRAIN, n_groups=3, clients_per_round=5)
    Simulation(strategy, synthetic(1, 1, 10, seed=1), model, seed=0)
    models = strategy.group_models
    assert len(models) == 3
    assert not np.array_equal(models[0], models[1]) and not np.array_equal(models[1], models[2])


def test_dsc_trains_every_client_one_gradient_step_at_the_letters_rate() -> None:
    """Sun et al. Alg. 1 aggregates all K clients; Eq. 5 is one gradient step at
    λ = 0.06 (MNIST, Sec. IV-A)."""
    from server.strategies.dsc import DSC
    from tests.server.strategies.fakes import FakeContext

    counts = {f"c{i}": np.eye(3)[i % 3] * 50 for i in range(7)}
    strategy = make_strategy("dsc")
    assert isinstance(strategy, DSC)
    strategy.setup(FakeContext(counts).clients(), np.zeros(4, np.float32), np.random.default_rng(0))

    plan = strategy.plan_round(1, FakeContext(counts))

    assert sorted(plan.participants) == sorted(counts)
    assert (plan.train.max_steps, plan.train.lr, plan.train.batch_size) == (1, 0.06, 60)
    assert DSC.paper_params >= {"clients_per_round", "local_steps"}


def test_group_models_are_scored_group_by_group(model) -> None:
    """The driver records each group model's accuracy over its clients (for the
    dashboard); a strategy without groups records none."""
    fed = synthetic(1, 1, 12, seed=0)
    ifca = make_strategy("ifca", train=TRAIN, n_groups=3, clients_per_round=12)
    records = Simulation(ifca, fed, model, seed=0).run(2)
    scored = {k: v for k, v in records[-1].extra.items() if k.startswith("group_acc_")}
    groups = {ifca.group_of(c) for c in fed}
    assert len(groups) > 1 and set(scored) == {f"group_acc_{g}" for g in groups}
    assert all(0.0 <= v <= 1.0 for v in scored.values())
    plain = Simulation(make_strategy("fedavg", train=TRAIN, clients_per_round=12), fed, model, seed=0).run(1)
    assert not any(k.startswith("group_acc_") for k in plain[-1].extra)
