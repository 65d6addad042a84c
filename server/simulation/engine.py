"""The simulation backend: virtual devices for the one round driver (no broker).

:class:`VirtualDevices` is the simulator's :class:`~server.backend.Backend`: it runs
each work unit (one device's training, one pre-training, one evaluation) with
:class:`Trainer`, which calls the same device code a board runs. With
``workers > 1`` work units run on that many threads of this process, each with its
own one-thread interpreter (``worker_kind = "thread"``, the default:
:mod:`server.simulation.threads`), or on forked worker processes (``"process"``: the
data are shared copy-on-write; one batch of units per worker and map, weights through
shared memory: :mod:`server.simulation.pool`); results do not depend on either. :class:`Simulation`
is the driver and this backend together.

A plan runs as on boards, by the coordinator's own group managers
(:class:`~server.execution.round.RoundExecution`) over the simulator's in-process bus
(:class:`~server.simulation.virtual_bus.VirtualBus`), whose virtual devices run a board's
task code: the same requests, hand-offs, deadlines, resends and screening of relayed
hand-offs, models in the run's ``codec`` (``device/protocol/codecs.py``), and the same
results. Each round's record holds the bytes of the frames that carried the models
(``wire_bytes``: the sum of ``wire_bytes_down``, what reached devices from the server, a
shared start model once for each device it reached, and ``wire_bytes_up``, what devices
sent, each frame once; ``wire_radio_bytes``: what the devices' links carried, where a
direct hand-off counts on the sender's link and, as ``wire_bytes_peer``, on the
receiver's; :class:`~server.backend.RoundStats`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from device.data import class_counts
from device.protocol import (
    DEFAULT_MAX_CHUNK,
    EvalRow,
    Topics,
    WireCodec,
)
from server.backend import EvalJob, RoundRecord, RoundStats, ServerEvaluator
from server.costs import CostModel
from server.defense import ServerNorm
from server.downlink import downlinks_for
from server.execution.round import ExecutionSettings, RoundExecution
from server.execution.shared import SharedModels
from server.hops import HopBound
from server.rounds import DEFAULT_SCREENING, RoundDriver
from server.screening import ScreeningConfig
from server.simulation.channel import NoisyUplinks
from server.simulation.datasets import ClientData, Federation, SwapShift
from server.simulation.faults import Faults
from server.simulation.pool import SharedPool, balance
from server.simulation.threads import WORKER_KINDS, ThreadWorkers, WorkerKind
from server.simulation.trainer import Trainer
from server.simulation.virtual_bus import Report, VirtualBus
from server.strategies.base import ClientInfo, GroupResult, RoundPlan, Strategy

Handoff = Literal["auto", "direct", "relay", "mixed"]  # the coordinator's --handoff modes
SIM_RUN = "sim"  # the run id of a simulation's topics and task ids
SIM_DEADLINE_S = 60.0  # on the bus's own clock: a silent member costs no wall time
SHIFT_STREAM = 0x5817  # the distribution shift draws from its own stream, never the strategy's

# -- where work units run ----------------------------------------------------------------------


class _Local:
    """Runs work units in this process (workers = 1)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def map(
        self, method: str | Callable[..., Any], calls: Sequence[tuple[Any, ...]], costs: Sequence[float] | None = None
    ) -> list[Any]:
        fn = getattr(self.trainer, method) if isinstance(method, str) else partial(method, self.trainer)
        return [fn(*a) for a in calls]

    def close(self) -> None:
        pass


def _pool(workers: int, model_path: str, data: Mapping[str, ClientData], faults: Faults, n_params: int) -> SharedPool:
    """Forked workers, each with its own interpreter over the data (shared copy-on-write)."""
    return SharedPool(workers, lambda: Trainer(model_path, data, threads=1, faults=faults), slot_bytes=4 * n_params)


# -- the backend -------------------------------------------------------------------------------


class VirtualDevices:
    """Every client of ``federation`` as a virtual device.

    Parameters
    ----------
    federation : client id -> :class:`ClientData`.
    model_path : the zoo ``.tflite`` (manifest beside it).
    workers : interpreters for training and evaluation (1: one, with two threads).
    worker_kind : with ``workers > 1``, ``"thread"`` (threads of this process) or
        ``"process"`` (forked processes); see the module docstring.
    snr_db, distance : optional link matrices (clients in sorted id order) offered to
        strategies that group by link quality (DSC, FedAvg-IC, HierFAVG).
    shift : optional distribution shift applied before every round (FlexCFL).
    seed : seeds the shift's own generator.
    faults : devices that never answer, and poisoners (:mod:`server.simulation.faults`).
    codec : how models travel (``fp32``, ``fp16``, ``int8``, ``int4``; module docstring).
    handoff : chain hand-offs as the coordinator's ``--handoff`` (``auto``, ``direct``,
        ``relay``, ``mixed``; :mod:`server.execution.round`).
    edges : a site's edges (name -> devices behind it), offered to strategies as on
        boards (HierFAVG groups by them); every group still runs in this process.
    channel : noisy uplinks that corrupt the updates on their way in
        (:mod:`server.simulation.channel`); ``None``: a noiseless network.
    """

    def __init__(
        self,
        federation: Federation,
        model_path: Path | str,
        *,
        workers: int = 1,
        worker_kind: WorkerKind = "thread",
        snr_db: np.ndarray | None = None,
        distance: np.ndarray | None = None,
        shift: SwapShift | None = None,
        seed: int = 0,
        faults: Faults | None = None,
        codec: WireCodec = "fp32",
        handoff: Handoff = "auto",
        edges: Mapping[str, Sequence[str]] | None = None,
        channel: NoisyUplinks | None = None,
    ) -> None:
        self.channel = channel
        self._site_edges = {d: name for name, devices in (edges or {}).items() for d in devices}
        if worker_kind not in WORKER_KINDS:
            raise ValueError(f"worker_kind must be one of {WORKER_KINDS}, got {worker_kind!r}")
        self.faults = faults or Faults()
        self.codec: WireCodec = codec
        self.handoff: Handoff = handoff
        self.downlinks = downlinks_for(codec)  # int8 and int4 runs: what each device holds
        self.federation = federation
        self.ids = sorted(federation)
        self.model_path = str(model_path)
        self.local = Trainer(model_path, federation, threads=1 if workers > 1 else 2, faults=self.faults)
        self.n_classes = self.local.model.manifest.n_classes
        for data in federation.values():
            for part in (data.train, data.test):
                if len(part):
                    self.local.model.check_data(part.x, part.y)  # clear error if the model does not fit
        self.workers = workers
        self.n_params = self.local.model.n_params
        self.pool: _Local | SharedPool | ThreadWorkers = _Local(self.local)
        if workers > 1 and worker_kind == "process":
            self.pool = self._new_pool()
        elif workers > 1:  # the threads share this process's data: a shift reaches them as it is made
            more = [Trainer(model_path, federation, threads=1, faults=self.faults) for _ in range(workers - 1)]
            self.pool = ThreadWorkers([self.local, *more])
        self._snr, self._distance = snr_db, distance
        self.shift = shift
        self.shift_rng = np.random.default_rng([int(seed), SHIFT_STREAM])
        self.seen: set[str] = set()
        topics = Topics(SIM_RUN)
        self.bus = VirtualBus(
            topics, self.local.model, federation, self._train, silent=self.faults.unresponsive, codec=codec
        )
        self.execution = RoundExecution(
            ExecutionSettings(SIM_RUN, handoff, SIM_DEADLINE_S, DEFAULT_MAX_CHUNK, codec),
            topics=topics,
            bus=self.bus,
            clock=self.bus.now,
            known=federation,
            shared=SharedModels(topics, self.bus.publish, DEFAULT_MAX_CHUNK, SIM_RUN),
            bases={},
            downlinks=self.downlinks,
            task_prefix=SIM_RUN,
        )
        self.bus.execution = self.execution
        # only fp32 runs pass models whole, with a token for a hash: nothing may name one by it
        assert self.downlinks is None or not self.bus.carries

    def _new_pool(self) -> SharedPool:
        return _pool(self.workers, self.model_path, self.federation, self.faults, self.n_params)

    def _train_size(self, clients: Sequence[str]) -> float:
        return float(sum(len(self.federation[c].train) for c in clients))

    def initial_weights(self) -> np.ndarray:
        return self.local.model.get_weights()

    # -- Backend --------------------------------------------------------------------------
    def _info(self, cid: str) -> ClientInfo:
        d = self.federation[cid]
        counts = self.faults.claimed_counts(cid, class_counts(d.train.y, self.n_classes))
        return ClientInfo(cid, int(counts.sum()), counts, len(d.test))

    def clients(self) -> Sequence[ClientInfo]:
        return [self._info(c) for c in self.ids]

    def before_round(self, rnd: int) -> dict[str, float]:
        if self.shift is None:
            return {}
        moved = self.shift.apply(self.federation, sorted(self.seen), self.shift_rng)
        if moved and isinstance(self.pool, SharedPool):  # workers hold their own copy of the data
            self.pool.close()
            self.pool = self._new_pool()
        return {"shifted_clients": float(len(moved))}

    def _answers(self, clients: Sequence[str]) -> list[str]:
        return [c for c in clients if c not in self.faults.unresponsive]

    def execute(self, plan: RoundPlan, *, seed: int, hop: HopBound | None = None) -> list[GroupResult]:
        """Run ``plan`` through the group managers over the bus (module docstring)."""
        base_of = self.downlinks.base_of if self.downlinks is not None else None
        try:
            results = self.execution.run(plan, seed, hop)
            if self.channel is not None:  # the updates cross noisy links on their way in
                results = self.channel.apply(plan, results)
        finally:  # the acknowledgement: devices forget their outputs (and nothing stale is left)
            self.bus.end_round(self.execution.task_ids(), base_of)
        self.seen.update(plan.participants)
        return results

    def _train(self, calls: list[tuple[Any, ...]], costs: list[float], report: Report) -> None:
        """A batch of virtual devices' training (:meth:`Trainer.train`) on the workers;
        each device's report follows on the thread that trained it (encoding and handing
        on its output beside the others' training), or here after worker processes."""
        if isinstance(self.pool, SharedPool):
            for i, trained in enumerate(self.pool.map("train", calls, costs)):
                report(i, trained)
            return

        def train_and_report(trainer: Trainer, index: int, *call: Any) -> None:
            report(index, trainer.train(*call))

        self.pool.map(train_and_report, [(i, *call) for i, call in enumerate(calls)], costs)

    def pretrain(
        self, client_ids: Sequence[str], weights: np.ndarray, *, steps: int, batch: int, lr: float, seed: int, rnd: int
    ) -> dict[str, np.ndarray]:
        answering = self._answers(client_ids)
        updates = self.pool.map("pretrain", [(weights, c, steps, batch, lr, seed, rnd) for c in answering])
        return dict(zip(answering, updates, strict=True))

    def evaluate(self, jobs: Sequence[EvalJob], *, rnd: int) -> list[dict[str, list[EvalRow]]]:
        """Each job's clients in up to one part per worker, balanced by sample count."""
        calls, costs, owner = [], [], []
        for j, job in enumerate(jobs):
            clients = self._answers(job.clients)
            sizes = [float(len(getattr(self.federation[c], job.split))) for c in clients]
            for part in balance(sizes, self.workers) or [[]]:
                calls.append((list(job.models), [clients[i] for i in part], job.split))
                costs.append(sum(sizes[i] for i in part) * len(job.models))
                owner.append(j)
        rows: list[dict[str, list[EvalRow]]] = [{} for _ in jobs]
        for j, part_rows in zip(owner, self.pool.map("evaluate", calls, costs), strict=True):
            rows[j].update(part_rows)
        return [{c: r[c] for c in self._answers(job.clients)} for job, r in zip(jobs, rows, strict=True)]

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {c: class_counts(self.federation[c].train.y, self.n_classes) for c in client_ids}

    def snr_matrix(self) -> np.ndarray | None:
        return self._snr

    def distance_matrix(self) -> np.ndarray | None:
        return self._distance

    def site_edges(self) -> dict[str, str]:
        return dict(self._site_edges)

    def offline(self) -> frozenset[str]:
        return frozenset()

    def round_stats(self) -> RoundStats:
        wire, self.bus.wire = self.bus.wire, {"down": 0, "up": 0, "peer": 0}
        dropped, self.bus.dropped = self.bus.dropped, 0
        return RoundStats(
            self.execution.handoff_counts(),
            {"message refused by a simulated device or manager": dropped} if dropped else {},
            wire_bytes=wire,
            resends=self.execution.resends(),
            server_bytes=self.execution.payload_bytes(),
        )

    def close(self) -> None:
        self.pool.close()


class Simulation:
    """Drive ``strategy`` over the virtual devices of ``federation``.

    Parameters
    ----------
    strategy : any :class:`Strategy`.
    federation : client id -> :class:`ClientData`.
    model_path : the zoo ``.tflite`` (manifest beside it).
    seed : seeds the strategy's generator and every client's batch order.
    workers : interpreters for training and evaluation (see :class:`VirtualDevices`).
    worker_kind : threads or processes when ``workers > 1`` (see :class:`VirtualDevices`).
    snr_db, distance : optional link matrices (see :class:`VirtualDevices`).
    shift : optional distribution shift applied before every round (FlexCFL).
    cost_model : Eq. (15)-(17) parameters.
    federated_eval_every : score clients every N rounds (1: every round).
    faults : devices that never answer, and poisoners (:mod:`server.simulation.faults`).
    max_attempts : plans per round when every sampled device fails (:mod:`server.rounds`).
    screening : the update-norm bound and aggregation rule (:mod:`server.screening`);
        ``None``: none, FedAvg's mean.
    server_eval : the global model's accuracy and loss on a held-out set (as the
        coordinator's ``--eval-data``).
    reference : the norm of an update the server trains on that held-out set
        (:func:`server.reference.server_norm`; the coordinator computes it when it has
        ``--eval-data``), one entry of screening's reference.
    codec : how models travel (see :class:`VirtualDevices`).
    handoff : chain hand-offs (see :class:`VirtualDevices`).
    edges : a site's edges (see :class:`VirtualDevices`).
    channel : noisy uplinks (see :class:`VirtualDevices`).
    """

    def __init__(
        self,
        strategy: Strategy,
        federation: Federation,
        model_path: Path | str,
        *,
        seed: int = 0,
        workers: int = 1,
        worker_kind: WorkerKind = "thread",
        snr_db: np.ndarray | None = None,
        distance: np.ndarray | None = None,
        shift: SwapShift | None = None,
        cost_model: CostModel | None = None,
        federated_eval_every: int = 1,
        faults: Faults | None = None,
        max_attempts: int = 3,
        screening: ScreeningConfig | None = DEFAULT_SCREENING,
        server_eval: ServerEvaluator | None = None,
        reference: ServerNorm | None = None,
        codec: WireCodec = "fp32",
        handoff: Handoff = "auto",
        edges: Mapping[str, Sequence[str]] | None = None,
        channel: NoisyUplinks | None = None,
    ) -> None:
        self.strategy = strategy
        self.devices = VirtualDevices(
            federation,
            model_path,
            workers=workers,
            worker_kind=worker_kind,
            snr_db=snr_db,
            distance=distance,
            shift=shift,
            seed=seed,
            faults=faults,
            codec=codec,
            handoff=handoff,
            edges=edges,
            channel=channel,
        )
        self.driver = RoundDriver(
            strategy,
            self.devices,
            seed=seed,
            cost_model=cost_model,
            federated_eval_every=federated_eval_every,
            max_attempts=max_attempts,
            screening=screening,
            server_eval=server_eval,
            reference=reference,  # with screening off too: the guard's bound needs a scale
        )
        self.driver.setup(self.devices.initial_weights(), self.devices.local.model.manifest.tensor_sizes())

    @property
    def records(self) -> list[RoundRecord]:
        return self.driver.records

    @property
    def rnd(self) -> int:
        return self.driver.rnd

    def step(self) -> RoundRecord:
        return self.driver.step()

    def run(self, rounds: int, progress: Callable[[RoundRecord], None] | None = None) -> list[RoundRecord]:
        """Run ``rounds`` more rounds, then release the workers."""
        try:
            return self.driver.run(self.driver.rnd + rounds, progress)
        finally:
            self.close()

    def close(self) -> None:
        self.devices.close()
