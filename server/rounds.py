"""The one round driver: plan → execute → aggregate → evaluate → record.

The simulator and the coordinator both run rounds through :class:`RoundDriver`. Each
supplies only a :class:`Backend`: where the devices are (virtual devices in this
process, its threads or worker processes, or boards over MQTT) and how to ask them for training,
pre-training, evaluation, class counts and link matrices. Everything else — the
order of the hooks, the seed rule, the conversion of a strategy's training settings
into what a device receives, evaluation and the record of a round — is written here
once, so that the same seed and plan give the same models in both (a test holds them
together, ``tests/mqtt/test_equivalence.py``).

A round whose sampled devices all fail (every group came back without a single
member's result) is retried: the devices that failed are marked unavailable to the
strategy (:attr:`Strategy.unavailable`, which its sampling honours) and it plans the
round again, up to ``max_attempts`` plans in all. The record's ``extra`` then holds
``retries`` (plans beyond the first) and ``retry_excluded`` (devices set aside); a
round that still got nothing keeps every model as it was (``failed_round`` = 1). The
retry never runs when something came back, so it cannot change a run without failures.

Accuracies are named for what they measure (:class:`RoundRecord`):
``federated_accuracy`` scores every client with the model it would use now
(:meth:`Strategy.model_for`) on its own test set, weighted by test samples (what the
papers report); ``server_accuracy`` scores the global model on a held-out set the
server owns, when there is one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from device.errors import CoveyError
from server.backend import Backend, EvalJob, RoundRecord, ServerEvaluator, planned_groups
from server.claims import bounded_info, bounded_infos, population_cap
from server.costs import CostModel
from server.defense import AGGREGATE_REASON, GUARD_FACTOR, OVERCLAIM_REASON, Defense, Refusals, ServerNorm
from server.hops import HOP_REASON, HopBound, hop_bound
from server.metrics import median_group_cpd
from server.screening import Rejection, ScreeningConfig, screen_updates, without_empty_members
from server.strategies.base import ClientInfo, GroupResult, RoundContext, RoundPlan, Strategy

log = logging.getLogger("covey.server")
DEFAULT_SCREENING = ScreeningConfig()  # on: refused above 10x the reference, clipped above 3x, weights capped


class _Context:
    """The :class:`RoundContext` a strategy sees: the backend, with the round, the seed
    and the strategy's own training settings filled in."""

    def __init__(self, driver: RoundDriver) -> None:
        self._driver = driver

    def clients(self) -> Sequence[ClientInfo]:
        return self._driver.clients()

    def pretrain(self, client_ids: Sequence[str], weights: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        d = self._driver
        t = d.strategy.train
        updates = d.backend.pretrain(
            list(client_ids), weights, steps=steps, batch=t.batch_size, lr=t.lr, seed=d.seed, rnd=d.rnd
        )
        if d.screening is None:
            return updates
        kept, rejections = screen_updates(updates, d.screening)
        d.note_rejections(rejections)
        return kept

    def losses(self, client_ids: Sequence[str], models: Sequence[np.ndarray]) -> np.ndarray:
        ids = list(client_ids)
        (rows,) = self._driver.backend.evaluate([EvalJob(tuple(models), tuple(ids), "train")], rnd=self._driver.rnd)
        out = np.full((len(ids), len(models)), np.inf)
        for i, c in enumerate(ids):
            for row in rows.get(c, []):
                out[i, row.index] = row.loss
        return out

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self._driver.backend.class_counts(client_ids)

    def snr_matrix(self) -> np.ndarray | None:
        return self._driver.backend.snr_matrix()

    def distance_matrix(self) -> np.ndarray | None:
        return self._driver.backend.distance_matrix()

    def site_edges(self) -> dict[str, str]:
        return self._driver.backend.site_edges()


class RoundDriver:
    """Drive ``strategy`` over ``backend``, one round per :meth:`step`.

    Parameters
    ----------
    strategy : any :class:`Strategy`.
    backend : virtual devices or boards (:class:`Backend`).
    seed : seeds the strategy's generator (``np.random.default_rng(seed)``) and every
        device's batch order (``device/training.py``).
    federated_eval_every : score clients on their own test sets every N rounds (0:
        never); the last round is always scored when N > 0.
    server_eval : the global model's accuracy and loss on the server's held-out set.
    cost_model : FedGSP Eq. (15)-(17) parameters.
    last_round : the run's last round (to score it even off the schedule).
    max_attempts : plans per round at most when every sampled device fails (1: no retry).
    screening : the bounds on claims and updates and the aggregation rule
        (:mod:`server.defense`; ``None``: none, the sample-weighted mean, and only the
        guard on the aggregate).
    reference : the norm of an update the server trains on its own data
        (:func:`server.reference.server_norm`), one entry of screening's reference.
    """

    def __init__(
        self,
        strategy: Strategy,
        backend: Backend,
        *,
        seed: int,
        federated_eval_every: int = 1,
        server_eval: ServerEvaluator | None = None,
        cost_model: CostModel | None = None,
        last_round: int | None = None,
        max_attempts: int = 3,
        screening: ScreeningConfig | None = DEFAULT_SCREENING,
        reference: ServerNorm | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.screening = screening
        self.defense = Defense(screening, reference)
        self.refusals = Refusals()  # this round's, until its record is written
        self.strategy, self.backend, self.seed = strategy, backend, int(seed)
        self.federated_eval_every = federated_eval_every
        self.server_eval = server_eval
        self.cost_model = cost_model or CostModel()
        self.last_round = last_round
        self.on_planned: Callable[[RoundPlan], None] | None = None  # e.g. the coordinator's round journal
        self.rnd = 0
        self.records: list[RoundRecord] = []
        self.context: RoundContext = _Context(self)
        self.model_bytes = 0

    def setup(self, initial_weights: np.ndarray, tensor_sizes: Sequence[int] = ()) -> None:
        """Give the strategy its clients, the initial model and the run's generator.

        Parameters
        ----------
        initial_weights : the model's flat float32 weights.
        tensor_sizes : the sizes of the model's tensors in that vector, in order (the
            manifest's layout); strategies that draw fresh models per tensor use it.
        """
        self.model_bytes = int(np.asarray(initial_weights, np.float32).nbytes)
        self.strategy.tensor_sizes = tuple(int(s) for s in tensor_sizes)
        self.strategy.setup(self.clients(), initial_weights, np.random.default_rng(self.seed))
        self._configure_strategy()

    def clients(self) -> list[ClientInfo]:
        """The backend's clients as strategies see them: counts above the population cap
        scaled down (:func:`server.claims.bounded_infos`)."""
        return bounded_infos(self.backend.clients(), self._weight_cap)

    def add_client(self, client: ClientInfo) -> None:
        """A device that registered (again) during the run, bounded like the others."""
        cap = population_cap({c.client_id: int(c.n_samples) for c in self.backend.clients()}, self._weight_cap)
        self.strategy.add_client(bounded_info(client, cap))

    @property
    def _weight_cap(self) -> float | None:
        return self.screening.weight_cap if self.screening is not None else None

    def resume(
        self,
        rnd: int,
        records: Sequence[RoundRecord],
        model_bytes: int,
        screening_history: Mapping[str, Sequence[Sequence[float]]] | None = None,
    ) -> None:
        """Continue after round ``rnd`` (the strategy was restored from a checkpoint), with
        the screening history :meth:`screening_history` gave then (None: none kept, so
        the bounds start again from the server's own update, or from nothing)."""
        self.rnd, self.records, self.model_bytes = rnd, list(records), model_bytes
        if screening_history is not None:
            self.defense.restore_history(screening_history)
        self._configure_strategy()

    def screening_history(self) -> dict[str, list[list[float]]]:
        """The accepted update norms screening keeps, for a checkpoint."""
        return self.defense.history_state()

    def _configure_strategy(self) -> None:
        """The aggregation rule is the run's setting, not the strategy's state."""
        s = self.screening
        self.strategy.aggregation = s.aggregation if s is not None else "mean"
        self.strategy.trim = s.trim if s is not None else DEFAULT_SCREENING.trim

    def note_rejections(self, rejections: Sequence[Rejection]) -> None:
        """Log refused updates; they are counted in this round's record."""
        factor = self.screening.norm_factor if self.screening is not None else GUARD_FACTOR
        for r in rejections:
            log.warning("round %d: screened out the %s", self.rnd, r.describe(factor or GUARD_FACTOR))
        self.refusals.screened(rejections)

    def step(self, planned: RoundPlan | None = None) -> RoundRecord:
        """One round. ``planned``: the plan of this round journaled before a crash (the
        strategy was restored as it was right after planning), executed instead of
        planning again."""
        self.rnd += 1
        start = time.perf_counter()
        extra = dict(self.backend.before_round(self.rnd))
        plan, results, excluded, attempts = self._plan_and_execute(planned)
        if excluded:
            extra["retries"] = float(attempts - 1)
            extra["retry_excluded"] = float(len(excluded))
            if _nothing_returned(plan, results):
                extra["failed_round"] = 1.0
        trained = sum(len(r.members) for r in results)
        results = self._defend(plan, results, extra)
        before = None if self.strategy.global_weights is None else self.strategy.global_weights.copy()
        summary = self.strategy.aggregate(self.rnd, plan, results)
        why = self.defense.guard(before, self.strategy.global_weights)
        if why is not None:  # the previous global model stays
            log.warning("round %d: the new global model is not applied: %s", self.rnd, why)
            self.strategy.global_weights = before
            self.refusals.refuse(AGGREGATE_REASON)
        by_group: dict[int, float] = {}
        due = self._federated_due()
        fed_acc, fed_loss = self.federated_evaluation(by_group) if due else (float("nan"), float("nan"))
        extra.update({f"group_acc_{g}": acc for g, acc in sorted(by_group.items())})
        srv_acc, srv_loss = (float("nan"), float("nan"))
        if self.server_eval is not None and self.strategy.global_weights is not None:
            srv_acc, srv_loss = self.server_eval(self.strategy.global_weights)
        costs = self.cost_model.round_costs(plan, results, plan.train.epochs, self.model_bytes, summary.aggregation)
        stats = self.backend.round_stats()
        extra.update(summary.extra)
        extra.update(stats.wire_extra())
        if stats.resends:
            extra["resends"] = float(stats.resends)
        extra.update({f"server_bytes_{k}": float(v) for k, v in stats.server_bytes.items()})
        dropped, rejected = self.refusals.tally(stats.dropped, stats.rejected)
        record = RoundRecord(
            round=self.rnd,
            federated_accuracy=fed_acc,
            federated_loss=fed_loss,
            server_accuracy=srv_acc,
            server_loss=srv_loss,
            train_loss=summary.train_loss,
            n_groups=summary.n_groups,
            participants=len(plan.participants),
            trained=trained,
            skipped=sum(len(r.skipped) for r in results),
            median_cpd=median_group_cpd(
                [g.members for g in plan.groups], {c.client_id: c.class_counts for c in self.backend.clients()}
            ),
            bytes=costs["bytes"],
            t_comp_s=costs["t_comp_s"],
            t_comm_s=costs["t_comm_s"],
            wall_s=time.perf_counter() - start,
            handoff=dict(stats.handoff),
            dropped=dropped,
            extra=extra,
            trained_ids=sorted(m.client_id for r in results for m in r.members),
            rejected=rejected,
            t_round_s=costs.get("t_round_s", float("nan")),
            groups=[sorted(g) for g in summary.groups],
            plan=planned_groups(plan),
            skipped_ids=sorted(d for r in results for d in r.skipped),
        )
        self.records.append(record)
        return record

    def _defend(self, plan: RoundPlan, results: list[GroupResult], extra: dict[str, float]) -> list[GroupResult]:
        """Claims bounded, updates screened and clipped (:mod:`server.defense`); what was
        done goes to the record (``extra``, and refusals by reason and device)."""
        for device in _refused_on_the_way(self.rnd, plan, results):
            self.refusals.refuse(HOP_REASON, device)
        results, empty = without_empty_members(results)  # always: a zero weight breaks every average
        self.note_rejections(empty)
        clients = self.backend.clients()
        bounded = self.defense.bound(results, clients)
        for device in bounded.overclaimed:
            log.warning("round %d: %s claimed more samples than it registered; counted as registered", self.rnd, device)
            self.refusals.refuse(OVERCLAIM_REASON, device)
        if bounded.capped:
            extra["weights_capped"] = float(bounded.capped)
        server = self.defense.server_norm(plan, self.seed, clients)  # screening off: the guard's scale
        screened = self.defense.screen(plan, bounded.results, server)
        self.note_rejections(screened.rejections)
        if screened.clipped:
            extra["clipped"] = float(len(screened.clipped))
            for devices, kind, factor in screened.clipped:
                log.info("round %d: clipped the %s update of %s by %.3g", self.rnd, kind, ", ".join(devices), factor)
        if server is not None and np.isfinite(server):
            extra["server_update_norm"] = server
        bounded_norms = self.screening is not None and self.screening.norm_factor is not None
        if bounded_norms and np.isfinite(screened.max_ratio):
            extra["update_norm_max_ratio"] = screened.max_ratio  # the largest update over its reference
        return screened.results

    def _plan_and_execute(self, planned: RoundPlan | None) -> tuple[RoundPlan, list[GroupResult], set[str], int]:
        """Plan and run the round; plan again without the failed devices while nothing
        came back, up to ``max_attempts`` plans. Returns the last plan, its results, the
        devices set aside and the number of plans executed. ``planned``: a journaled plan
        to execute first instead of planning; every new plan goes to ``on_planned``."""
        plan = planned if planned is not None else self._plan()
        results = self.backend.execute(plan, seed=self.seed, hop=self._hop_bound(plan))
        excluded: set[str] = set()
        attempt = executed = 1
        while _nothing_returned(plan, results) and attempt < self.max_attempts:
            excluded.update(plan.participants)
            attempt += 1
            log.warning(
                "round %d: none of the %d sampled devices returned a model; planning again without them (%d of %d)",
                self.rnd,
                len(plan.participants),
                attempt,
                self.max_attempts,
            )
            self.strategy.unavailable = frozenset(excluded) | self.backend.offline()
            try:
                retry = scheduled(self.strategy.plan_round(self.rnd, self.context))
            except (CoveyError, ValueError) as exc:  # nobody else to ask, or too few to group
                log.warning("round %d: no other devices to try (%s)", self.rnd, exc)
                break
            finally:
                self.strategy.unavailable = frozenset()
            if self.on_planned is not None:  # journaled as it will run
                self.on_planned(retry)
            plan, results = retry, self.backend.execute(retry, seed=self.seed, hop=self._hop_bound(retry))
            executed += 1
        if excluded and _nothing_returned(plan, results):
            log.warning("round %d: no device returned a model; every model stays as it was", self.rnd)
        return plan, results, excluded, executed

    def _hop_bound(self, plan: RoundPlan) -> HopBound | None:
        """The bound on this plan's relayed chain hand-offs (None without chains): past
        rounds' accepted norms and the server's own update (the guard's bound alone with
        screening off)."""
        if not any(g.mode == "chain" for g in plan.groups):
            return None
        server = self.defense.server_norm(plan, self.seed, self.backend.clients())
        return hop_bound(self.screening, self.defense.past(), server)

    def _plan(self) -> RoundPlan:
        """The round's first plan, around the devices the backend knows are offline (a
        board whose last will came: asking it would only cost the round its deadline).
        If no plan can do without them, the plan asks everyone, as before."""
        offline = self.backend.offline() & {c.client_id for c in self.backend.clients()}
        plan = None
        if offline:
            log.info("round %d: planning without offline devices %s", self.rnd, ", ".join(sorted(offline)))
            self.strategy.unavailable = frozenset(offline)
            try:
                plan = scheduled(self.strategy.plan_round(self.rnd, self.context))
            except (CoveyError, ValueError) as exc:  # too few left to sample or group
                log.warning("round %d: no plan without the offline devices (%s); asking them too", self.rnd, exc)
            finally:
                self.strategy.unavailable = frozenset()
        if plan is None:
            plan = scheduled(self.strategy.plan_round(self.rnd, self.context))
        if self.on_planned is not None:
            self.on_planned(plan)
        return plan

    def run(self, rounds: int, progress: Callable[[RoundRecord], None] | None = None) -> list[RoundRecord]:
        """Step until round ``rounds`` (counting rounds already done)."""
        self.last_round = rounds
        while self.rnd < rounds:
            rec = self.step()
            if progress is not None:
                progress(rec)
        return self.records

    # -- evaluation ---------------------------------------------------------------------
    def _federated_due(self) -> bool:
        every = self.federated_eval_every
        return every > 0 and (self.rnd % every == 0 or self.rnd == self.last_round)

    def federated_evaluation(self, by_group: dict[int, float] | None = None) -> tuple[float, float]:
        """Weighted test accuracy and loss, every client with the model it would use now
        (``by_group``, if given, gets each group model's accuracy over its clients)."""
        return federated_evaluation(self.strategy, self.context, self.backend, self.rnd, by_group)


def federated_evaluation(
    strategy: Strategy,
    context: RoundContext,
    backend: Backend,
    rnd: int,
    by_group: dict[int, float] | None = None,
) -> tuple[float, float]:
    """The papers' federated accuracy: every client scores the model ``strategy`` would
    give it now on its own test set; the accuracy and loss weighted by test samples.
    Clients sharing a model are one job (``backend.evaluate`` sends that model once).
    ``by_group``: filled with each group's accuracy over the clients the strategy puts
    in it (:meth:`Strategy.group_of`; strategies with group models), for people."""
    strategy.prepare_evaluation(context)
    by_model: dict[int, tuple[np.ndarray, list[str]]] = {}
    for c in sorted(info.client_id for info in backend.clients()):
        m = strategy.model_for(c)
        by_model.setdefault(id(m), (m, []))[1].append(c)
    jobs = [EvalJob((m,), tuple(cs), "test") for m, cs in by_model.values()]
    correct = loss = n = 0.0
    group_counts: dict[int, list[float]] = {}
    for rows in backend.evaluate(jobs, rnd=rnd):
        for client, client_rows in rows.items():
            group = strategy.group_of(client) if by_group is not None else None
            for row in client_rows:
                correct += row.correct
                loss += row.loss * row.n
                n += row.n
                if group is not None:
                    tally = group_counts.setdefault(group, [0.0, 0.0])
                    tally[0] += row.correct
                    tally[1] += row.n
    if by_group is not None and len(group_counts) > 1:  # one group is the global accuracy again
        by_group.update({g: c / m for g, (c, m) in group_counts.items() if m})
    return (correct / n, loss / n) if n else (float("nan"), float("nan"))


def _refused_on_the_way(rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> list[str]:
    """Devices whose output a manager refused (chain hand-offs, server/hops.py, and
    failed training), each logged."""
    modes = {g.group_id: g.mode for g in plan.groups}
    refused = []
    for r in results:
        for device in r.refused:
            if modes.get(r.group_id) == "chain":
                log.warning("round %d: refused the hand-off of %s; its chain went on from its input", rnd, device)
            else:
                log.warning("round %d: refused the output of %s (not finite, or its training failed)", rnd, device)
            refused.append(device)
    return refused


def _nothing_returned(plan: RoundPlan, results: Sequence[GroupResult]) -> bool:
    """Every group of a non-empty plan came back without a single member's result."""
    return bool(plan.groups) and not any(r.members for r in results)


def scheduled(plan: RoundPlan) -> RoundPlan:
    """``plan`` with its round's learning rate (:meth:`TrainConfig.for_round`): the one
    place a schedule applies, for simulations and boards alike, before the plan is
    journaled (a resumed round trains with the rate it was planned with)."""
    train = plan.train.for_round(plan.round)
    return plan if train is plan.train else replace(plan, train=train)
