"""The round driver's port, and the records that pass through it.

A :class:`Backend` is where the devices are (virtual devices in this process, its
threads or worker processes, or boards over MQTT); :class:`~server.rounds.RoundDriver`
asks it for training, pre-training, evaluation, class counts and link matrices, and
records each round as a :class:`RoundRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from device.protocol import EvalRow, Split
from server.hops import HopBound
from server.strategies.base import ClientInfo, GroupResult, RoundPlan


@dataclass(frozen=True)
class EvalJob:
    """Evaluate each of ``models`` on each client's ``split``."""

    models: tuple[np.ndarray, ...] = field(repr=False)
    clients: tuple[str, ...]
    split: Split


@dataclass
class RoundStats:
    """What a backend observed besides results: hand-off modes used, messages it
    dropped (by reason) and, of those, the ones from each registered device, and the
    bytes of the model frames that moved (``"down"``: from the server to devices,
    ``"up"``: from devices, hand-offs included, ``"peer"``: the hand-offs a device
    received from another, which cross the sender's link and then the receiver's; empty
    when the backend does not count), since the last call."""

    handoff: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    wire_bytes: dict[str, int] = field(default_factory=dict)
    resends: int = 0  # requests and models sent again, outputs asked for again
    # the round's model payloads on the coordinator's link, "sent" and "received"
    # (RoundExecution.payload_bytes): the same count on boards and in simulation
    server_bytes: dict[str, int] = field(default_factory=dict)

    def wire_extra(self) -> dict[str, float]:
        """The measured frames for a record's ``extra``, beside the modelled ``bytes``:
        each count, what was sent (``wire_bytes``: down + up) and what the devices'
        links carried (``wire_radio_bytes``: a received hand-off crossed two links)."""
        if not self.wire_bytes:
            return {}
        sent = self.wire_bytes.get("down", 0) + self.wire_bytes.get("up", 0)
        extra = {f"wire_bytes_{k}": float(v) for k, v in self.wire_bytes.items()}
        return extra | {"wire_bytes": float(sent), "wire_radio_bytes": float(sent + self.wire_bytes.get("peer", 0))}


class Backend(Protocol):
    """Where the devices are. The driver calls these; nothing else differs between
    simulation and boards."""

    def clients(self) -> Sequence[ClientInfo]:
        """Every registered client, sorted by id."""
        ...

    def before_round(self, rnd: int) -> dict[str, float]:
        """Called first in every round (the simulator applies distribution shift);
        returns figures for the record's ``extra``."""
        ...

    def execute(self, plan: RoundPlan, *, seed: int, hop: HopBound | None = None) -> list[GroupResult]:
        """Run the plan; one result per group in plan order. ``hop``: the bound on each
        relayed chain hand-off (:mod:`server.hops`; None: none)."""
        ...

    def pretrain(
        self, client_ids: Sequence[str], weights: np.ndarray, *, steps: int, batch: int, lr: float, seed: int, rnd: int
    ) -> dict[str, np.ndarray]:
        """Pre-training updates of the clients that answered in time."""
        ...

    def evaluate(self, jobs: Sequence[EvalJob], *, rnd: int) -> list[dict[str, list[EvalRow]]]:
        """Per job, per client that answered: one row per model."""
        ...

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]: ...

    def snr_matrix(self) -> np.ndarray | None: ...

    def distance_matrix(self) -> np.ndarray | None: ...

    def site_edges(self) -> dict[str, str]:
        """Device -> the site edge it sits behind (empty: none)."""
        ...

    def round_stats(self) -> RoundStats:
        """Counters since the previous call."""
        ...

    def offline(self) -> frozenset[str]:
        """Registered devices known to be unreachable now (a board whose last will the
        broker published); the driver plans around them. A simulation's devices are
        never offline (a silent one is reachable and does not answer)."""
        ...


@dataclass
class RoundRecord:
    """One round, as both drivers record it.

    ``federated_*``: each client scored with the model it would use now on its own
    test set, weighted by test samples (NaN on rounds without federated evaluation).
    ``server_*``: the global model on the server's held-out set (NaN without one).
    ``bytes``, ``t_comp_s``, ``t_comm_s`` are modelled (FedGSP Eq. 15-17); ``wall_s``
    is measured. When the backend counts them, ``extra["wire_bytes"]`` is the bytes of
    the model frames that moved, each counted once as sent (``_down``: the server's, one
    per device that answers; ``_up``: the devices'), and ``extra["wire_radio_bytes"]``
    what the devices' own links carried: that, plus the hand-offs a device received
    from another (``_peer``, frames already counted in ``_up`` by their sender). ``trained``:
    members that returned a result; ``dropped``: what was refused, by reason
    (malformed or stale messages, admission, ``"screened: update norm"``);
    ``rejected``: per registered device, how many of its messages and updates were
    refused this round (:mod:`server.screening`).
    """

    round: int
    federated_accuracy: float
    federated_loss: float
    server_accuracy: float
    server_loss: float
    train_loss: float
    n_groups: int
    participants: int
    trained: int
    skipped: int
    median_cpd: float
    bytes: float
    t_comp_s: float
    t_comm_s: float
    wall_s: float
    handoff: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    trained_ids: list[str] = field(default_factory=list)  # whose results this round's models hold
    rejected: dict[str, int] = field(default_factory=dict)
    t_round_s: float = float("nan")  # modelled time of the round (simulation: on the topology's links)
    groups: list[list[str]] = field(default_factory=list)  # the groups as the strategy reports them
    # the round's (last) plan as it ran: each group's id, mode and members in order (a
    # chain's order is its training order), every group side by side (planned_groups)
    plan: list[dict[str, object]] = field(default_factory=list)
    skipped_ids: list[str] = field(default_factory=list)  # members that missed their deadline


def planned_groups(plan: RoundPlan) -> list[dict[str, object]]:
    """``plan``'s groups for a record: ``{"group": id, "mode": "chain" | "parallel",
    "members": [...]}`` in plan order, a chain's members in the order they train."""
    return [{"group": g.group_id, "mode": g.mode, "members": list(g.members)} for g in plan.groups]


ServerEvaluator = Callable[[np.ndarray], tuple[float, float]]


def records_as_dicts(records: Sequence[RoundRecord]) -> list[dict[str, object]]:
    return [asdict(r) for r in records]


def record_from_dict(row: Mapping[str, object]) -> RoundRecord:
    """A record read back from a checkpoint (which keeps NaN; a results JSON writes
    ``null`` for it, see :func:`server.records.strict_json_values`)."""
    return RoundRecord(**row)  # type: ignore[arg-type]
