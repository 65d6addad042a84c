"""The ``Strategy`` interface that the simulator and the MQTT coordinator both drive.

One round:

1. the driver calls :meth:`Strategy.plan_round` with a :class:`RoundContext`; the
   strategy answers with a :class:`RoundPlan`: the models to send (by key), and groups
   of clients, each trained as a *chain* (one after another, the model handed on) or
   in *parallel* (each member from the group's start model);
2. the driver runs the plan (virtual devices or real boards) and hands back one
   :class:`GroupResult` per group;
3. :meth:`Strategy.aggregate` folds the results into the strategy's models.

Between rounds :meth:`Strategy.model_for` says which model a client would use now
(its group's current model for clustered methods), which is how accuracy is scored.

A strategy that needs more than training results asks the context while planning:
pre-training updates (FedGroup/FlexCFL cold start), losses of candidate models on
clients' data (IFCA), clients' current class counts (FlexCFL migration), or the
link matrices (DSC's SNR, FedAvg-IC's distances). Following Flower's conventions a
strategy keeps its own state, never mutates the caller's config, and draws all
randomness from one ``np.random.Generator``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal, Protocol

import numpy as np

from device.protocol import LocalTraining
from server.aggregation.robust import AggregationRule, combine
from server.errors import StrategyError

GroupMode = Literal["chain", "parallel"]
# Where a parallel group's models meet (what a topology's time model charges):
# "server": every member exchanges its model with the server;
# "leader": members exchange with their group's leader, which exchanges with the server
#           (DSC's group leaders, Sun et al. Eq. 2-3; FedAvg-IC's global rounds);
# "leader_only": members exchange with their leader, the group model stays there
#           (FedAvg-IC's group aggregation, Lee et al. Eq. 5, d_group).
Aggregation = Literal["server", "leader", "leader_only"]


@dataclass(frozen=True)
class ClientInfo:
    """What the server knows about a client (from its registration)."""

    client_id: str
    n_samples: int
    class_counts: np.ndarray = field(repr=False)
    n_test: int = 0


@dataclass(frozen=True)
class TrainConfig:
    """Local training settings sent with a plan."""

    epochs: int = 1
    batch_size: int = 10
    lr: float = 0.01
    mu: float = 0.0  # FedProx proximal weight
    max_steps: int | None = None
    lr_decay: float = 1.0  # the learning rate of round r is lr * lr_decay ** (r - 1)

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0 or self.mu < 0:
            raise StrategyError(f"invalid training settings: {self}")
        if self.max_steps is not None and self.max_steps < 1:
            raise StrategyError("max_steps must be at least 1")
        if not 0 < self.lr_decay <= 1:
            raise StrategyError(f"lr_decay must be in (0, 1], got {self.lr_decay!r}")

    def for_round(self, rnd: int) -> TrainConfig:
        """The settings round ``rnd`` trains with: the learning rate decayed exponentially,
        once per round (``lr * lr_decay ** (rnd - 1)``; FedAvg-IC's Table 4 sets 0.99),
        and ``lr_decay`` itself left at 1 (what a plan carries is already that round's)."""
        if self.lr_decay == 1.0:
            return self
        return replace(self, lr=self.lr * self.lr_decay ** max(rnd - 1, 0), lr_decay=1.0)

    def to_wire(self) -> LocalTraining:
        """The one conversion to what a device receives (simulated devices too)."""
        return LocalTraining(self.epochs, self.batch_size, float(self.lr), float(self.mu), self.max_steps)


# How a ``mean_only`` group's members' models become its one model: their
# sample-weighted mean (FedAvg-IC Eq. 5, HierFAVG's edge aggregation), or DSC's
# angle-weighted aggregate (Sun et al. Eq. 2 and 4, server/aggregation/dsc_weights.py)
GroupRule = Literal["sample_mean", "dsc_angle"]


@dataclass(frozen=True)
class GroupPlan:
    """One group's work this round."""

    group_id: int
    members: tuple[str, ...]
    mode: GroupMode
    start_model: str  # key into RoundPlan.models
    # parallel groups: the strategy uses only one aggregate of the members' models, made
    # by ``group_rule``, so a manager near the members (a site's edge, server/edge/) may
    # send that aggregate alone (GroupResult.group_mean) instead of every member's model
    mean_only: bool = False
    group_rule: GroupRule = "sample_mean"

    def __post_init__(self) -> None:
        if self.mode not in ("chain", "parallel"):
            raise StrategyError(f"group mode must be 'chain' or 'parallel', got {self.mode!r}")
        if not self.members:
            raise StrategyError(f"group {self.group_id} has no members")


@dataclass(frozen=True)
class RoundPlan:
    round: int
    groups: tuple[GroupPlan, ...]
    models: Mapping[str, np.ndarray] = field(repr=False)
    train: TrainConfig = TrainConfig()

    def __post_init__(self) -> None:
        missing = {g.start_model for g in self.groups} - set(self.models)
        if missing:
            raise StrategyError(f"plan refers to models it does not carry: {sorted(missing)}")
        seen: set[str] = set()
        for g in self.groups:
            dup = seen.intersection(g.members)
            if dup:
                raise StrategyError(f"clients {sorted(dup)} appear in two groups")
            seen.update(g.members)

    @property
    def participants(self) -> list[str]:
        return [c for g in self.groups for c in g.members]


@dataclass(frozen=True)
class MemberResult:
    client_id: str
    n_samples: int
    train_loss: float
    weights: np.ndarray | None = field(default=None, repr=False)  # parallel mode: this member's model
    # ||weights - the group's start model||_2 (server.screening.update_norm), when the server
    # computed it as the weights came in (the simulator does, on its worker threads);
    # None: screening computes it. Never a device's claim. Code that replaces `weights`
    # with other values must clear it (screening trusts it).
    norm: float | None = field(default=None, repr=False)


@dataclass(frozen=True)
class EdgeMean:
    """An edge's sample-weighted mean of its part of a split group (its ``members``)."""

    edge: str
    members: tuple[str, ...]
    mean: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class GroupResult:
    """What came back for one group. ``final_weights`` is the chain's last model
    (chain mode); parallel mode carries every member's weights. ``skipped`` lists
    members that missed their deadline (their work is lost; the chain continued);
    ``refused`` members whose chain hand-off screening refused, or who reported that
    their training failed (the chain continued from their input; :mod:`server.hops`).

    A parallel group planned ``mean_only`` and run by an edge (``managed_by``) lists its
    members without their models and carries their aggregate in ``group_mean`` instead
    (:func:`returned` hands it on as one member). A group split between edges and the
    coordinator (:mod:`server.execution.split`) carries the models of the members run
    here and each edge's mean of its part (``edge_means``), each a member of its own."""

    group_id: int
    members: tuple[MemberResult, ...]
    final_weights: np.ndarray | None = field(default=None, repr=False)
    skipped: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    group_mean: np.ndarray | None = field(default=None, repr=False)
    managed_by: str | None = None  # the edge that ran the group; None: the coordinator
    # a split group's parts averaged at edges (server/execution/split.py): each weighs as
    # its members' samples, as the round driver's claim check bounded them (server/claims.py)
    edge_means: tuple[EdgeMean, ...] = ()

    @property
    def n_samples(self) -> int:
        return sum(m.n_samples for m in self.members)


class RoundContext(Protocol):
    """What a driver offers a strategy while it plans a round (or before it scores one).

    The simulator and the coordinator offer the same context through the one round
    driver (:mod:`server.rounds`): the answers come from virtual devices or from
    boards over MQTT, computed by the same device code (:mod:`device.training`).
    """

    def clients(self) -> Sequence[ClientInfo]:
        """Every registered client, sorted by id."""
        ...

    def pretrain(self, client_ids: Sequence[str], weights: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        """Each client's update ``w_after - weights`` after ``steps`` SGD steps at the
        strategy's batch size and learning rate. Clients that did not answer in time
        are missing from the result."""
        ...

    def losses(self, client_ids: Sequence[str], models: Sequence[np.ndarray]) -> np.ndarray:
        """Training loss of every candidate model on every client (clients x models);
        ``inf`` where a client did not answer."""
        ...

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Current class-count vectors (they change under distribution shift)."""
        ...

    def snr_matrix(self) -> np.ndarray | None:
        """Γ in dB (clients x clients, BS on the diagonal), or None if not measured."""
        ...

    def distance_matrix(self) -> np.ndarray | None:
        """Pairwise communication distance (RTT in ms or hops), or None."""
        ...

    def site_edges(self) -> dict[str, str]:
        """Device -> the site edge it sits behind (``covey site add-edge``); devices behind
        none are left out (empty: no edges)."""
        ...


@dataclass
class RoundSummary:
    """What a strategy reports after aggregating (merged into the driver's record)."""

    round: int
    n_groups: int
    groups: list[list[str]]
    train_loss: float
    extra: dict[str, float] = field(default_factory=dict)
    aggregation: Aggregation = "server"  # where the groups' models met (see Aggregation)


class Strategy(ABC):
    """A federated-learning method: the hooks the round driver calls, in order.

    Per run: :meth:`setup` once (after resuming from a checkpoint it is not called
    again), :meth:`add_client` for every device that registers later. Per round:
    :meth:`plan_round`, the driver executes the plan, :meth:`aggregate`, then
    :meth:`prepare_evaluation` and :meth:`model_for` for scoring. Following Flower's
    conventions a strategy keeps its own state, never mutates the caller's config,
    and draws all randomness from the one ``np.random.Generator`` given to
    :meth:`setup`.

    Class attributes: ``name`` (the registry key), ``summary`` (one line for
    ``covey strategies``), ``paper_train`` (local training as the method's paper sets
    it; it holds unless the user sets a value), ``paper_settings`` (where those
    values come from), ``paper_params`` (which constructor defaults are the
    paper's own, as opposed to covey's) and ``code_params`` (defaults the paper does
    not state, taken from its authors' public code; ``code_settings`` says where).
    """

    name: ClassVar[str] = "strategy"
    summary: ClassVar[str] = ""
    # clients the round driver set aside while it plans a round again, after every
    # device it sampled failed (server/rounds.py); sampling honours it (candidates())
    unavailable: frozenset[str] = frozenset()
    # how FedAvg-style averages are taken (set by the round driver from its screening
    # settings): the sample-weighted mean, or a robust rule (server/aggregation/robust.py)
    aggregation: AggregationRule = "mean"
    trim: float = 0.2
    # the sizes of the model's tensors in the flat weight vector, in order (set by the
    # round driver from the model's manifest before setup; empty: not known)
    tensor_sizes: tuple[int, ...] = ()
    paper_train: ClassVar[TrainConfig] = TrainConfig()
    paper_settings: ClassVar[str] = ""
    paper_params: ClassVar[frozenset[str]] = frozenset()
    code_params: ClassVar[frozenset[str]] = frozenset()
    code_settings: ClassVar[str] = ""

    def __init__(self, train: TrainConfig | None = None) -> None:
        self.train = train or type(self).paper_train
        self.global_weights: np.ndarray | None = None
        self.clients: dict[str, ClientInfo] = {}

    # -- hooks -------------------------------------------------------------------------
    def setup(self, clients: Sequence[ClientInfo], initial_weights: np.ndarray, rng: np.random.Generator) -> None:
        """Take the registered clients, the initial model and the run's generator.

        Parameters
        ----------
        clients : every client registered before round 1, sorted by id.
        initial_weights : the model's initial flat float32 weights.
        rng : the run's generator (seeded from the run's seed); the only randomness.
        """
        if not clients:
            raise StrategyError("no clients registered")
        self.clients = {c.client_id: c for c in clients}
        self.global_weights = np.asarray(initial_weights, np.float32).copy()
        self.rng = rng

    def add_client(self, client: ClientInfo) -> None:
        """A device registered after the start (a newcomer), or registered again with
        new counts."""
        self.clients[client.client_id] = client

    @abstractmethod
    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        """This round's work.

        Parameters
        ----------
        rnd : the round, from 1.
        ctx : pre-training, losses, class counts and link matrices on request.

        Returns
        -------
        RoundPlan : the models to send and the groups (chains or parallel members).
        """

    @abstractmethod
    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        """Fold what came back into the strategy's models.

        Parameters
        ----------
        rnd : the round.
        plan : the plan :meth:`plan_round` returned.
        results : one :class:`GroupResult` per planned group, in plan order; members
            that missed their deadline are listed as skipped.

        Returns
        -------
        RoundSummary : groups, mean training loss and strategy-specific figures.
        """

    def prepare_evaluation(self, ctx: RoundContext) -> None:
        """Called before clients are scored (IFCA re-assigns every client to the
        group model with the lowest loss). The default does nothing."""
        return None

    def model_for(self, client_id: str) -> np.ndarray:
        """The model ``client_id`` would use now: the method's output for that client
        (the global model unless a strategy keeps group models)."""
        assert self.global_weights is not None
        return self.global_weights

    def group_of(self, client_id: str) -> int | None:
        """The client's group, if the method keeps one."""
        return None

    def min_clients(self) -> int:
        """Registered clients the method needs before round 1."""
        return 1

    # -- helpers -----------------------------------------------------------------------
    def average(self, models: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
        """Average client or chain models by the run's rule (:attr:`aggregation`): the
        ``weights``-weighted mean (FedAvg), or the coordinate-wise median or trimmed mean
        of Yin et al. (ICML 2018), which ignore the weights."""
        return combine(models, weights, rule=self.aggregation, trim=self.trim)

    def candidates(self) -> list[str]:
        """The clients a round may sample, sorted: every registered one except those
        the driver marked :attr:`unavailable` for a retry."""
        return sorted(c for c in self.clients if c not in self.unavailable)

    def sample_clients(self, n: int) -> list[str]:
        ids = sorted(self.clients)
        if n > len(ids):
            raise StrategyError(f"asked for {n} clients per round but only {len(ids)} are registered")
        return [ids[i] for i in sorted(self.rng.choice(len(ids), size=n, replace=False))]


def returned(results: Sequence[GroupResult]) -> list[tuple[MemberResult, np.ndarray]]:
    """Members that returned their own model (parallel mode), with that model. A group
    an edge averaged (``group_mean``), and each edge's part of a split group
    (``edge_means``), counts as one member named ``group<id>@<edge>`` with its members'
    samples: the sample-weighted mean of such means is the mean of
    their members' models, which is all a ``mean_only`` plan's strategy uses."""
    out: list[tuple[MemberResult, np.ndarray]] = []
    for r in results:
        out += [(m, m.weights) for m in r.members if m.weights is not None]
        for part in r.edge_means:
            samples = sum(m.n_samples for m in r.members if m.client_id in part.members)
            if samples > 0:
                out.append(
                    (MemberResult(f"group{r.group_id}@{part.edge}", samples, mean_loss([r]), part.mean), part.mean)
                )
        samples = r.n_samples
        if r.group_mean is not None and samples > 0:
            mean = MemberResult(f"group{r.group_id}@{r.managed_by}", samples, mean_loss([r]), r.group_mean)
            out.append((mean, r.group_mean))
    return out


def mean_loss(results: Sequence[GroupResult]) -> float:
    total = sum(m.train_loss * m.n_samples for r in results for m in r.members)
    n = sum(m.n_samples for r in results for m in r.members)
    return total / n if n else float("nan")
