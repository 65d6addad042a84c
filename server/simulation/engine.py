"""The simulation engine: any :class:`Strategy` over in-process virtual devices.

No broker: the engine implements the strategy's :class:`RoundContext` itself and runs
each :class:`RoundPlan` with :class:`Trainer` (the real LiteRT train signatures). Work
units (one chain, one parallel member, one pre-training, one evaluation) go to a pool
of worker processes when ``workers > 1`` (fork: the data are shared copy-on-write);
results do not depend on the number of workers.

Per round it records (:class:`RoundRecord`): weighted test accuracy and loss (each
client scored with ``strategy.model_for(client)``, weighted by its test samples),
train loss, the median pairwise CPD of the round's groups, the bytes that would cross
the network, and the modelled computation and communication times of FedGSP
Eq. (15)-(17) (:class:`CostModel`).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device.data import class_counts
from server.metrics import pairwise_cpd
from server.simulation.datasets import ClientData, Federation, SwapShift
from server.simulation.trainer import ChainOutcome, Trainer
from server.strategies.base import (
    ClientInfo,
    GroupResult,
    MemberResult,
    RoundPlan,
    Strategy,
)

# -- cost model (FedGSP Sec. 4.1, Eq. 15-17) --------------------------------------------------


@dataclass(frozen=True)
class CostModel:
    """Modelled time and traffic, FedGSP's defaults: 96 MFLOPs per training sample,
    6.3 MFLOPs per aggregated model, a 567 GFLOPS device (Snapdragon 835 / Adreno 540),
    567 Mbit/s in and out. Model size comes from the actual weights."""

    flops_per_sample: float = 96e6
    flops_per_aggregation: float = 6.3e6
    device_flops: float = 567e9
    rate_in_bps: float = 567e6
    rate_out_bps: float = 567e6

    def round_costs(
        self, plan: RoundPlan, results: Sequence[GroupResult], epochs: int, model_bytes: int
    ) -> dict[str, float]:
        # Eq. (15): the longest sequential workload (a chain trains its members in turn)
        longest = 0
        models = 0
        downloads = uploads = 0
        for g, r in zip(plan.groups, results, strict=True):
            counts = [m.n_samples for m in r.members]
            if g.mode == "chain":
                longest = max(longest, sum(counts))
                models += 1
                downloads += len(g.members)  # the first gets the model, each successor the hand-off
                uploads += len(g.members)  # each hands on; the last returns the chain's model
            else:
                longest = max([longest, *counts])
                models += len(g.members)
                downloads += len(g.members)
                uploads += len(g.members)
        comp = self.flops_per_sample / self.device_flops * longest * epochs
        comp += self.flops_per_aggregation / self.device_flops * max(models - 1, 0)
        # Eq. (16)-(17) per round: 8 bits per byte over the in/out rates
        comm = 8 * model_bytes * (downloads / self.rate_in_bps + uploads / self.rate_out_bps)
        return {"t_comp_s": comp, "t_comm_s": comm, "bytes": float(model_bytes * (downloads + uploads))}


# -- records -----------------------------------------------------------------------------------


@dataclass
class RoundRecord:
    round: int
    test_accuracy: float
    test_loss: float
    train_loss: float
    n_groups: int
    participants: int
    median_cpd: float
    bytes: float
    t_comp_s: float
    t_comm_s: float
    wall_s: float
    extra: dict[str, float] = field(default_factory=dict)


# -- worker side -------------------------------------------------------------------------------

_WORKER: Trainer | None = None


def _init_worker(model_path: str, data: Mapping[str, ClientData]) -> None:
    global _WORKER
    _WORKER = Trainer(model_path, data, threads=1)


def _call(method: str, *args: Any) -> Any:
    assert _WORKER is not None
    return getattr(_WORKER, method)(*args)


class _Local:
    """Runs work units in this process (workers = 1)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def map(self, method: str, calls: Iterable[tuple[Any, ...]]) -> list[Any]:
        return [getattr(self.trainer, method)(*a) for a in calls]

    def close(self) -> None:
        pass


class _Pool:
    def __init__(self, workers: int, model_path: str, data: Mapping[str, ClientData]) -> None:
        self.executor = ProcessPoolExecutor(
            workers, mp_context=mp.get_context("fork"), initializer=_init_worker, initargs=(model_path, data)
        )

    def map(self, method: str, calls: Iterable[tuple[Any, ...]]) -> list[Any]:
        futures: list[Future[Any]] = [self.executor.submit(_call, method, *a) for a in calls]
        return [f.result() for f in futures]

    def close(self) -> None:
        self.executor.shutdown(cancel_futures=True)


# -- the engine --------------------------------------------------------------------------------


class Simulation:
    """Drive ``strategy`` over the virtual devices of ``federation``.

    Parameters
    ----------
    strategy: any :class:`Strategy`.
    federation: client id -> :class:`ClientData`.
    model_path: the zoo ``.tflite`` (manifest beside it).
    seed: seeds the strategy's generator and every client's batch order.
    workers: processes for training and evaluation (1: in this process).
    snr_db, distance: optional link matrices (clients in sorted id order) offered to
        strategies that group by link quality (DSC, FedAvg-IC, HierFAVG).
    shift: optional distribution shift applied before every round (FlexCFL).
    cost_model: Eq. (15)-(17) parameters.
    """

    def __init__(
        self,
        strategy: Strategy,
        federation: Federation,
        model_path: Path | str,
        *,
        seed: int = 0,
        workers: int = 1,
        snr_db: np.ndarray | None = None,
        distance: np.ndarray | None = None,
        shift: SwapShift | None = None,
        cost_model: CostModel | None = None,
    ) -> None:
        self.strategy = strategy
        self.federation = federation
        self.ids = sorted(federation)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.local = Trainer(model_path, federation, threads=1 if workers > 1 else 2)
        self.n_classes = self.local.model.manifest.n_classes
        for cid, data in federation.items():
            for part in (data.train, data.test):
                if len(part):
                    self.local.model.check_data(part.x, part.y)  # clear error if the model does not fit
        self.workers = workers
        self.pool: _Local | _Pool = _Pool(workers, str(model_path), federation) if workers > 1 else _Local(self.local)
        self._snr, self._distance = snr_db, distance
        self.shift = shift
        self.cost_model = cost_model or CostModel()
        self.records: list[RoundRecord] = []
        self.seen: set[str] = set()
        infos = [self._info(c) for c in self.ids]
        initial = self.local.model.get_weights()
        self.model_bytes = int(initial.nbytes)
        strategy.setup(infos, initial, self.rng)
        self.rnd = 0

    # -- RoundContext -----------------------------------------------------------------
    def _info(self, cid: str) -> ClientInfo:
        d = self.federation[cid]
        return ClientInfo(cid, len(d.train), class_counts(d.train.y, self.n_classes), len(d.test))

    def clients(self) -> Sequence[ClientInfo]:
        return [self._info(c) for c in self.ids]

    def pretrain(self, client_ids: Sequence[str], weights: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        cfg = self.strategy.train
        updates = self.pool.map("pretrain", [(weights, c, steps, cfg, self.seed) for c in client_ids])
        return dict(zip(client_ids, updates, strict=True))

    def losses(self, client_ids: Sequence[str], models: Sequence[np.ndarray]) -> np.ndarray:
        out = np.zeros((len(client_ids), len(models)))
        per_model = self.pool.map("evaluate", [(m, list(client_ids), "train") for m in models])
        for j, rows in enumerate(per_model):
            out[:, j] = [loss for loss, _, _ in rows]
        return out

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {c: class_counts(self.federation[c].train.y, self.n_classes) for c in client_ids}

    def snr_matrix(self) -> np.ndarray | None:
        return self._snr

    def distance_matrix(self) -> np.ndarray | None:
        return self._distance

    # -- running ---------------------------------------------------------------------------
    def _execute(self, plan: RoundPlan) -> list[GroupResult]:
        chains = [g for g in plan.groups if g.mode == "chain"]
        parallel = [(g, c) for g in plan.groups if g.mode == "parallel" for c in g.members]
        chain_out: list[ChainOutcome] = self.pool.map(
            "chain", [(plan.models[g.start_model], list(g.members), plan.train, self.seed, plan.round) for g in chains]
        )
        member_out: list[MemberResult] = self.pool.map(
            "parallel", [(plan.models[g.start_model], c, plan.train, self.seed, plan.round) for g, c in parallel]
        )
        by_chain = {g.group_id: o for g, o in zip(chains, chain_out, strict=True)}
        by_member = {c: o for (_, c), o in zip(parallel, member_out, strict=True)}
        results = []
        for g in plan.groups:
            if g.mode == "chain":
                o = by_chain[g.group_id]
                results.append(GroupResult(g.group_id, o.members, o.final_weights))
            else:
                results.append(GroupResult(g.group_id, tuple(by_member[c] for c in g.members)))
        return results

    def evaluate(self) -> tuple[float, float]:
        """Weighted test accuracy and loss, every client with the model it would use now."""
        prepare: Callable[[Any], None] | None = getattr(self.strategy, "prepare_evaluation", None)
        if prepare is not None:
            prepare(self)
        by_model: dict[int, tuple[np.ndarray, list[str]]] = {}
        for c in self.ids:
            m = self.strategy.model_for(c)
            by_model.setdefault(id(m), (m, []))[1].append(c)
        groups = list(by_model.values())
        rows = self.pool.map("evaluate", [(m, cs, "test") for m, cs in groups])
        loss = correct = n = 0.0
        for per_client in rows:
            for c_loss, c_correct, c_n in per_client:
                loss += c_loss * c_n
                correct += c_correct
                n += c_n
        return (correct / n, loss / n) if n else (float("nan"), float("nan"))

    def step(self) -> RoundRecord:
        self.rnd += 1
        start = time.perf_counter()
        extra: dict[str, float] = {}
        if self.shift is not None:
            moved = self.shift.apply(self.federation, sorted(self.seen), self.rng)
            extra["shifted_clients"] = float(len(moved))
            if moved and isinstance(self.pool, _Pool):  # workers hold their own copy of the data
                self.pool.close()
                self.pool = _Pool(self.workers, str(self.local.model.path), self.federation)
        plan = self.strategy.plan_round(self.rnd, self)
        results = self._execute(plan)
        summary = self.strategy.aggregate(self.rnd, plan, results)
        self.seen.update(plan.participants)
        acc, loss = self.evaluate()
        counts = np.array([self._info(c).class_counts for c in self.ids], np.float64)
        index = {c: i for i, c in enumerate(self.ids)}
        groups = [np.array([index[c] for c in g.members]) for g in plan.groups]
        cpd = float(np.median(pairwise_cpd(counts, groups))) if len(groups) > 1 else 0.0
        costs = self.cost_model.round_costs(plan, results, plan.train.epochs, self.model_bytes)
        extra.update(summary.extra)
        record = RoundRecord(
            self.rnd,
            acc,
            loss,
            summary.train_loss,
            summary.n_groups,
            len(plan.participants),
            cpd,
            costs["bytes"],
            costs["t_comp_s"],
            costs["t_comm_s"],
            time.perf_counter() - start,
            extra,
        )
        self.records.append(record)
        return record

    def run(self, rounds: int, progress: Callable[[RoundRecord], None] | None = None) -> list[RoundRecord]:
        try:
            for _ in range(rounds):
                rec = self.step()
                if progress is not None:
                    progress(rec)
        finally:
            self.close()
        return self.records

    def close(self) -> None:
        self.pool.close()


def records_as_dicts(records: Sequence[RoundRecord]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]
