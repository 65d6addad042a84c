"""The simulation backend: virtual devices for the one round driver (no broker).

:class:`VirtualDevices` is the simulator's :class:`~server.backend.Backend`: it runs
each work unit (one chain, one parallel member, one pre-training, one evaluation)
with :class:`Trainer`, which calls the same device code a board runs. With
``workers > 1`` work units run on that many threads of this process, each with its
own one-thread interpreter (``worker_kind = "thread"``, the default:
:mod:`server.simulation.threads`), or on forked worker processes (``"process"``: the
data are shared copy-on-write; one batch of units per worker and map, weights through
shared memory: :mod:`server.simulation.pool`); results do not depend on either. :class:`Simulation`
is the driver and this backend together.

Models move as they would over MQTT in the run's ``codec`` (``device/protocol/codecs.py``,
the same choice the coordinator's group managers make): start models in the downlink
codec (``int8``, ``int4``: a delta against the model the device holds when the server
knows it, else the whole model as ``q8``, which every virtual device decodes;
``server/downlink.py``, with the same bookkeeping as the coordinator), parallel
outputs in the upload codec (``int8``, ``int4``: a delta against the start model as
received, with each device's error feedback, added to the float32 start model), chain
hand-offs in the downlink codec, except in delta runs, where they are relayed through the manager as
the coordinator relays them with its default hand-off mode (``handoff``,
:meth:`VirtualDevices._relayed_chains`). Each round's
record holds the bytes of the frames that carried them (``wire_bytes``: each frame once,
as sent, the sum of ``wire_bytes_down`` and ``wire_bytes_up``; ``wire_radio_bytes``: what
the devices' links carried, where a direct hand-off counts on the sender's link and,
as ``wire_bytes_peer``, on the receiver's; :class:`~server.backend.RoundStats`,
:mod:`server.simulation.wire`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from device.data import class_counts
from device.protocol import (
    DELTA_CODECS,
    DELTA_WIRE_CODECS,
    ErrorFeedback,
    EvalRow,
    FrameCodec,
    LocalTraining,
    WireCodec,
    decode,
    downlink_codec,
    encode_output,
    first_codec,
    upload_codec,
    wire_bits,
)
from server.backend import EvalJob, RoundRecord, RoundStats, ServerEvaluator
from server.costs import CostModel
from server.defense import ServerNorm
from server.downlink import DownlinkModels
from server.hops import HopBound
from server.rounds import DEFAULT_SCREENING, RoundDriver
from server.screening import ScreeningConfig, update_norm
from server.simulation.chains import answering_runs
from server.simulation.datasets import ClientData, Federation, SwapShift
from server.simulation.faults import Faults
from server.simulation.pool import SharedPool, balance
from server.simulation.threads import WORKER_KINDS, ThreadWorkers, WorkerKind
from server.simulation.trainer import ChainOutcome, Trainer
from server.simulation.wire import frame_bytes
from server.strategies.base import ClientInfo, GroupPlan, GroupResult, MemberResult, RoundPlan, Strategy

Handoff = Literal["auto", "direct", "relay", "mixed"]  # the coordinator's --handoff modes
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
        ``relay``, ``mixed``); it matters in ``int8`` and ``int4`` runs only (:meth:`_relays`).
    measure_norms : give each parallel member's result its update norm
        (:attr:`MemberResult.norm`), for a driver that screens by norm.
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
        measure_norms: bool = False,
    ) -> None:
        if worker_kind not in WORKER_KINDS:
            raise ValueError(f"worker_kind must be one of {WORKER_KINDS}, got {worker_kind!r}")
        self.faults = faults or Faults()
        self.codec: WireCodec = codec
        self.handoff: Handoff = handoff
        self.measure_norms = measure_norms
        self.feedback: dict[str, ErrorFeedback] = {}  # each device's delta residual, as a board keeps it
        bits = wire_bits(codec)  # what each device holds, for downlink deltas
        self.downlinks = DownlinkModels(
            downlink_codec(codec), deltas=bits is not None, bits=bits or 8, first=first_codec(codec)
        )
        self._wire = {"down": 0, "up": 0, "peer": 0}
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

    def _relays(self, index: int) -> bool:
        """Whether the group at ``index`` of a plan relays its chain's hand-offs as int8
        deltas, as the coordinator picks (``server/coordinator/execution.py``). Outside
        ``int8`` runs relayed and direct hand-offs give the same models, so they run as
        direct ones here."""
        if self.codec not in DELTA_WIRE_CODECS:
            return False
        return self.handoff in ("auto", "relay") or (self.handoff == "mixed" and index % 2 == 1)

    def _relayed_on_boards(self, index: int) -> bool:
        """Whether the coordinator relays the hand-offs of the group at ``index`` through
        its manager whatever the codec (``handoff`` ``auto`` or ``relay``, or ``mixed`` at
        odd positions; ``server/coordinator/execution.py``), screening each hand-off
        (``server/hops.py``). Outside delta runs this simulator runs them as direct
        hand-offs with the same checks, which give the same models, and counts what the
        next member received as the manager's frame (``down``) instead of a device's
        (``peer``)."""
        return self.handoff in ("auto", "relay") or (self.handoff == "mixed" and index % 2 == 1)

    def execute(self, plan: RoundPlan, *, seed: int, hop: HopBound | None = None) -> list[GroupResult]:
        settings = plan.train.to_wire()
        # the hand-offs the coordinator relays are screened one by one (server/hops.py)
        hops = {g.group_id: hop if self._relayed_on_boards(i) else None for i, g in enumerate(plan.groups)}
        down, up = downlink_codec(self.codec), upload_codec(self.codec)
        relayed = {g.group_id for i, g in enumerate(plan.groups) if g.mode == "chain" and self._relays(i)}
        received: dict[tuple[int, str], np.ndarray] = {}  # (group, device) -> the start model as it decodes it
        for g in plan.groups:
            if g.group_id not in relayed:
                devices = self._receivers(g.mode, g.members)
                models = self._download(g.group_id, devices, plan.models[g.start_model], plan.round)
                received |= {(g.group_id, c): m for c, m in zip(devices, models, strict=True)}
        chains = [g for g in plan.groups if g.mode == "chain"]
        direct = [g for g in chains if g.group_id not in relayed]
        parallel = [(g, c) for g in plan.groups if g.mode == "parallel" for c in self._answers(g.members)]
        direct_out = self._direct_chains(plan, direct, received, settings, seed, down, hops)
        by_chain = {g.group_id: o for g, o in zip(direct, direct_out, strict=True)}
        relay_groups = [g for g in chains if g.group_id in relayed]
        by_chain |= {
            g.group_id: o
            for g, o in zip(
                relay_groups, self._relayed_chains(plan, relay_groups, settings, seed, up, hops), strict=True
            )
        }
        calls = [(received[g.group_id, c], c, settings, seed, plan.round) for g, c in parallel]
        costs = [self._train_size([c]) for _, c in parallel]
        starts = [plan.models[g.start_model] for g, _ in parallel]
        if isinstance(self.pool, SharedPool):  # forked workers train; this process decodes
            outs: list[MemberResult] = self.pool.map("parallel", calls, costs)
            members = [self._received(o, s, call[0], up) for o, s, call in zip(outs, starts, calls, strict=True)]
        else:  # each member decoded and measured on the thread that trained it
            with_start = [(*call, s, up) for call, s in zip(calls, starts, strict=True)]
            members = self.pool.map(self._member, with_start, costs)
        by_member: dict[str, MemberResult] = {}
        for (_, c), (member, sent) in zip(parallel, members, strict=True):
            by_member[c] = member
            self._wire["up"] += sent
        results = []
        for index, g in enumerate(plan.groups):
            silent = tuple(c for c in g.members if c in self.faults.unresponsive)  # skipped, as on boards
            if g.mode == "chain":
                o = by_chain[g.group_id]
                self._wire["up"] += o.wire_bytes
                self._wire["down" if self._relayed_on_boards(index) else "peer"] += o.handed_on
                results.append(GroupResult(g.group_id, o.members, o.final_weights, silent, o.refused))
            else:
                results.append(
                    GroupResult(g.group_id, tuple(by_member[c] for c in g.members if c in by_member), None, silent)
                )
        self.seen.update(plan.participants)
        return results

    def _direct_chains(
        self,
        plan: RoundPlan,
        groups: Sequence[GroupPlan],
        received: Mapping[tuple[int, str], np.ndarray],
        settings: LocalTraining,
        seed: int,
        down: FrameCodec,
        hops: Mapping[int, HopBound | None],
    ) -> list[ChainOutcome]:
        """Chains whose hand-offs go device to device in ``down``, as the coordinator's
        manager runs them (``server/coordinator/manager.py``), in runs of members that
        answer (:func:`~server.simulation.chains.answering_runs`). After a silent
        member, the manager asks the last member that answered to send its output
        again, as float32 (once: it keeps it for further silent members), and
        forwards it as a start model (:meth:`_download`: a delta or ``q8`` in ``int8`` and
        ``int4`` runs) to each member after the first silent one; the first member
        that answers trains from it. A chain that ends in silent members ends with
        that float32 output. Runs of different chains train side by side, in waves."""
        models = {g.group_id: plan.models[g.start_model] for g in groups}
        members: dict[int, list[MemberResult]] = {g.group_id: [] for g in groups}
        refused: dict[int, list[str]] = {g.group_id: [] for g in groups}
        sent, handed_on = dict.fromkeys(models, 0), dict.fromkeys(models, 0)
        runs = {g.group_id: answering_runs(g.members, set(self._answers(g.members))) for g in groups}
        for g in groups:
            if runs[g.group_id]:
                models[g.group_id] = received[g.group_id, runs[g.group_id][0].members[0]]
        wave = 0
        while todo := [g for g in groups if wave < len(runs[g.group_id])]:
            turn = [runs[g.group_id][wave] for g in todo]
            outs: list[ChainOutcome] = self.pool.map(
                "chain",
                [
                    (
                        models[g.group_id],
                        r.members,
                        settings,
                        seed,
                        plan.round,
                        down,
                        bool(r.silent_after),
                        hops.get(g.group_id),
                    )
                    for g, r in zip(todo, turn, strict=True)
                ],
                [self._train_size(r.members) for r in turn],
            )
            for g, r, out in zip(todo, turn, outs, strict=True):
                members[g.group_id] += out.members
                refused[g.group_id] += out.refused
                resent = frame_bytes(out.final_weights, "raw") if r.silent_after else 0
                sent[g.group_id] += out.wire_bytes + resent
                handed_on[g.group_id] += out.handed_on
                models[g.group_id] = out.final_weights
                following = runs[g.group_id][wave + 1].members[:1] if wave + 1 < len(runs[g.group_id]) else ()
                forwarded_to = [*r.silent_after[1:], *following]
                if forwarded_to:
                    forwarded = self._download(g.group_id, forwarded_to, out.final_weights, plan.round)
                    if following:
                        models[g.group_id] = forwarded[-1]
            wave += 1
        return [
            ChainOutcome(
                models[g.group_id],
                tuple(members[g.group_id]),
                sent[g.group_id],
                handed_on[g.group_id],
                tuple(refused[g.group_id]),
            )
            for g in groups
        ]

    def _relayed_chains(
        self,
        plan: RoundPlan,
        groups: Sequence[GroupPlan],
        settings: LocalTraining,
        seed: int,
        up: FrameCodec,
        hops: Mapping[int, HopBound | None],
    ) -> list[ChainOutcome]:
        """Chains whose hand-offs go through the manager, as the coordinator relays them
        in ``int8`` runs (``server/coordinator/manager.py``): position by position, every
        chain's member at that position trains at once; its output comes back as an upload
        (a delta against the model it received, added to the float32 model sent), and the
        sum goes to the successor as a start model (a downlink delta against the model the
        successor holds). A silent member is sent its model and skipped, as the manager does
        at its deadline. Each output is screened on arrival (``hops``, :mod:`server.hops`): a
        refused one is not credited and its successor gets the refused member's input."""
        current = {g.group_id: plan.models[g.start_model] for g in groups}
        members: dict[int, list[MemberResult]] = {g.group_id: [] for g in groups}
        refused: dict[int, list[str]] = {g.group_id: [] for g in groups}
        for position in range(max((len(g.members) for g in groups), default=0)):
            turn = [(g, g.members[position]) for g in groups if position < len(g.members)]
            starts = {g.group_id: self._download(g.group_id, [c], current[g.group_id], plan.round)[0] for g, c in turn}
            answering = [(g, c) for g, c in turn if c not in self.faults.unresponsive]
            outs: list[MemberResult] = self.pool.map(
                "parallel",
                [(starts[g.group_id], c, settings, seed, plan.round) for g, c in answering],
                [self._train_size([c]) for _, c in answering],
            )
            for (g, c), out in zip(answering, outs, strict=True):
                back, sent = self._upload(out, current[g.group_id], starts[g.group_id], up)
                self._wire["up"] += sent
                assert back.weights is not None
                bound = hops.get(g.group_id)
                if bound is not None:
                    checked, _ = bound.check(current[g.group_id], back.weights)
                else:
                    checked = back.weights if bool(np.isfinite(back.weights).all()) else None
                if checked is None:
                    refused[g.group_id].append(c)
                    continue
                current[g.group_id] = checked
                members[g.group_id].append(dataclasses.replace(back, weights=None))
        return [
            ChainOutcome(current[g.group_id], tuple(members[g.group_id]), refused=tuple(refused[g.group_id]))
            for g in groups
        ]

    def _receivers(self, mode: str, members: Sequence[str]) -> list[str]:
        """Who the server sends a group's start model to: every parallel member; in a
        chain the first member, and the successor of each silent member before the first
        that answers (as the manager does). What it forwards after a silent member
        further on is :meth:`_direct_chains`'s (relayed chains: :meth:`_relayed_chains`)."""
        if mode == "parallel":
            return list(members)
        answering = set(self._answers(members))
        first = next((i for i, c in enumerate(members) if c in answering), len(members) - 1)
        return list(members[: first + 1])

    def _download(self, group: int, devices: Sequence[str], weights: np.ndarray, rnd: int) -> list[np.ndarray]:
        """The start model as each of ``devices`` decodes it (a downlink delta against the
        model it holds in ``int8`` runs, ``server/downlink.py``); counted on the wire for
        each device that answers, which gets its own frame. A silent board is counted as
        gone (nothing reaches it), while a hand-off sent *to* a silent successor left its
        sender and counts as sent (``up``), not as received (``peer``; :meth:`_direct_chains`)."""
        task = f"r{rnd}-g{group}"
        received = []
        for device, down in zip(devices, self.downlinks.encode_all(devices, weights), strict=True):
            self.downlinks.sent(device, task, down.key)
            if device not in self.faults.unresponsive:
                self.downlinks.confirm(device, task)
                self._wire["down"] += frame_bytes(down.payload, down.codec)
            received.append(down.received)
        return received

    def _upload(
        self, member: MemberResult, start: np.ndarray, received: np.ndarray, codec: FrameCodec
    ) -> tuple[MemberResult, int]:
        """A parallel member's output as the coordinator decodes it, and the bytes of its frame."""
        assert member.weights is not None
        feedback = self.feedback.setdefault(member.client_id, ErrorFeedback())  # one thread per client
        payload, used = encode_output(member.weights, received, codec, feedback)
        weights = decode(payload, used, start if used in DELTA_CODECS else None)
        return dataclasses.replace(member, weights=weights), frame_bytes(payload, used)

    def _received(
        self, member: MemberResult, start: np.ndarray, received: np.ndarray, codec: FrameCodec
    ) -> tuple[MemberResult, int]:
        """:meth:`_upload`, with the decoded update's norm against the group's start model
        (what screening bounds, :func:`~server.screening.update_norm`)."""
        decoded, sent = self._upload(member, start, received, codec)
        if not self.measure_norms:
            return decoded, sent
        assert decoded.weights is not None
        return dataclasses.replace(decoded, norm=update_norm(start, decoded.weights)), sent

    def _member(
        self,
        trainer: Trainer,
        received: np.ndarray,
        client: str,
        settings: LocalTraining,
        seed: int,
        rnd: int,
        start: np.ndarray,
        codec: FrameCodec,
    ) -> tuple[MemberResult, int]:
        """One parallel member on a worker thread: trained from ``received``, then
        :meth:`_received`. Decoding and the norm run beside the other threads' training
        instead of after all of it, on the main thread, whose serial share of a round
        bounds what more workers gain (docs/results.md, "Simulation speed")."""
        return self._received(trainer.parallel(received, client, settings, seed, rnd), start, received, codec)

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

    def round_stats(self) -> RoundStats:
        wire, self._wire = self._wire, {"down": 0, "up": 0, "peer": 0}
        return RoundStats(wire_bytes=wire)

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
            measure_norms=screening is not None and screening.norm_factor is not None,
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
        self.driver.setup(self.devices.initial_weights())

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
