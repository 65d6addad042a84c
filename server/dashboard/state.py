"""What the dashboard page shows, as one JSON-able dict built from a run's records.

Pure functions over a run's ``results.json`` document (:func:`server.records.write_run`:
settings, rounds, links, devices) and, for a live run, the coordinator's view of its
fleet (:func:`live_fleet`). The same dict feeds the live page (pushed as server-sent
events) and the static report (embedded), so both show the same thing. Every string
in it is data: the page writes it with ``textContent``, never as markup.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The round fields the learning panel plots (RoundRecord's names).
CURVE_KEYS = ("server_accuracy", "federated_accuracy", "server_loss", "train_loss", "bytes", "wall_s")
MAX_EVENTS = 200  # the latest; a long run's page stays small


@dataclass(frozen=True)
class FleetEntry:
    """One board as the coordinator sees it now (a live run only)."""

    device: str
    online: bool
    last_seen_at: float | None  # when its last message came (Unix seconds, whole); None: not known


def _number(value: Any) -> float | None:
    """A finite float, else ``None`` (JSON has no NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _setting(doc: Mapping[str, Any], key: str) -> Any:
    settings = doc.get("settings")
    raw = settings.get(key) if isinstance(settings, Mapping) else None
    return raw.get("value") if isinstance(raw, Mapping) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _matrix(raw: Any) -> list[list[float | None]] | None:
    """A square list of numbers (non-finite ones as ``None``), else ``None``."""
    if not isinstance(raw, list) or not all(isinstance(row, list) for row in raw):
        return None
    return [[_number(v) for v in row] for row in raw]


def fleet(doc: Mapping[str, Any], live: Iterable[FleetEntry] = ()) -> list[dict[str, Any]]:
    """Each board: what it said it is, its latest telemetry, the refusals counted
    against it over the run, and (live) whether it is online.

    Parameters
    ----------
    doc : the run's ``results.json`` document (may be empty before round 1).
    live : the coordinator's current view of its boards.

    Returns
    -------
    list of dict
        One per board, sorted by id.
    """
    devices = _mapping(doc.get("devices"))
    now = {e.device: e for e in live}
    refusals: dict[str, int] = {}
    for r in doc.get("rounds", []):
        for device, n in (r.get("rejected") or {}).items():
            refusals[str(device)] = refusals.get(str(device), 0) + _count(n)
    out = []
    for device in sorted(set(devices) | set(now) | set(refusals)):
        record = _mapping(devices.get(device))
        platform = _mapping(record.get("platform"))
        telemetry = record.get("telemetry") if isinstance(record.get("telemetry"), list) else []
        last = _mapping(telemetry[-1] if telemetry else None)
        trained = record.get("train_seconds") if isinstance(record.get("train_seconds"), list) else []
        last_train = trained[-1] if trained and isinstance(trained[-1], list) and len(trained[-1]) == 2 else None
        entry = now.get(device)
        out.append(
            {
                "id": str(device),
                "machine": str(platform.get("machine", "")),
                "backend": " ".join(str(platform.get(k, "")) for k in ("backend", "backend_version")).strip(),
                "online": None if entry is None else entry.online,
                "last_seen_at": None if entry is None else _number(entry.last_seen_at),
                "train_s": None if last_train is None else _number(last_train[1]),
                "peak_rss_mb": _number(last.get("peak_rss_mb")),
                "cpu_temp_c": _number(last.get("cpu_temp_c")),
                "throttled": last.get("throttled") if isinstance(last.get("throttled"), int) else None,
                "telemetry_round": last.get("round") if isinstance(last.get("round"), int) else None,
                "refusals": refusals.get(device, 0),
            }
        )
    return out


def events(rounds: Sequence[Mapping[str, Any]], run_events: Any = ()) -> list[dict[str, Any]]:
    """What went wrong or was done about it, round by round: refusals by reason and
    by board, skipped members, retries, clipped updates, failed rounds; and what
    happened to the run itself (``run_events``: resumed from a checkpoint, reconnected)."""
    out: list[dict[str, Any]] = []
    for e in run_events if isinstance(run_events, list) else []:
        if isinstance(e, Mapping):
            kind, detail = str(e.get("kind", "")), str(e.get("detail", ""))
            event = {"round": _number(e.get("round")), "kind": kind, "detail": detail}
            if e.get("device") is not None:
                event["device"] = str(e["device"])
            out.append(event)
    for r in rounds:
        rnd = r.get("round")
        for reason, n in sorted((r.get("dropped") or {}).items()):
            out.append({"round": rnd, "kind": "refused", "detail": f"{n} x {reason}"})
        for device, n in sorted((r.get("rejected") or {}).items()):
            out.append({"round": rnd, "kind": "refused", "device": str(device), "detail": f"{n} message(s)"})
        named = r.get("skipped_ids")
        if isinstance(named, list) and named:
            for device in named:
                out.append({"round": rnd, "kind": "skipped", "device": str(device), "detail": "missed the deadline"})
        elif r.get("skipped"):  # a record from before skipped_ids
            out.append({"round": rnd, "kind": "skipped", "detail": f"{r['skipped']} member(s) missed the deadline"})
        extra = _mapping(r.get("extra"))
        for key, label in (
            ("retries", "planned again"),
            ("resends", "sent again or asked for again"),
            ("clipped", "updates clipped"),
            ("failed_round", "no result"),
        ):
            value = _number(extra.get(key))
            if value:
                out.append({"round": rnd, "kind": key, "detail": f"{label}: {value:g}"})
    out.sort(key=lambda e: e["round"] if isinstance(e["round"], (int, float)) else -1)  # stable: by round
    return out[-MAX_EVENTS:]


def plan(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A round's plan as it ran (:func:`server.backend.planned_groups`): each group's
    id, mode (``chain``: members train in the order listed; ``parallel``: side by side)
    and members. Every group of a round runs side by side with the others."""
    out = []
    raw = record.get("plan")
    for g in raw if isinstance(raw, list) else []:
        if isinstance(g, Mapping) and isinstance(g.get("members"), list):
            mode = g.get("mode")
            out.append(
                {
                    "group": _number(g.get("group")),
                    "mode": mode if mode in ("chain", "parallel") else "",
                    "members": [str(m) for m in g["members"]],
                }
            )
    return out


def links(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """Γ and RTT with where each entry came from (:meth:`server.links.LinkMatrices.to_dict`)."""
    raw = doc.get("links")
    if not isinstance(raw, Mapping) or not raw.get("ids"):
        return None
    ids = [str(i) for i in raw["ids"]] if isinstance(raw["ids"], list) else []
    return {
        "ids": ids,
        "snr_db": _matrix(raw.get("snr_db")),
        "snr_source": raw.get("snr_source") if isinstance(raw.get("snr_source"), list) else None,
        "rtt_ms": _matrix(raw.get("rtt_ms")),
        "rtt_source": raw.get("rtt_source") if isinstance(raw.get("rtt_source"), list) else None,
    }


def page_state(
    doc: Mapping[str, Any],
    *,
    live: Iterable[FleetEntry] = (),
    status: str = "finished",
    round_in_progress: int | None = None,
) -> dict[str, Any]:
    """The page's whole state.

    Parameters
    ----------
    doc : the run's ``results.json`` document (``{}`` before round 1).
    live : the coordinator's boards now (a live run).
    status : ``"registering"``, ``"measuring links"``, ``"running"`` or ``"finished"``.
    round_in_progress : the round being run, if one is.

    Returns
    -------
    dict
        ``run`` (strategy, rounds planned, rounds done, status), ``fleet``
        (:func:`fleet`), ``rounds`` (the curves' fields per round), ``groups`` (the
        last round's, as the strategy reports them), ``plan`` (:func:`plan`, the last
        round's), ``links`` (:func:`links`) and ``events`` (:func:`events`).
    """
    rounds = [r for r in doc.get("rounds", []) if isinstance(r, Mapping)]
    curves: list[dict[str, Any]] = [
        {"round": _number(r.get("round")), **{k: _number(r.get(k)) for k in CURVE_KEYS}} for r in rounds
    ]
    for row, r in zip(curves, rounds, strict=True):
        row["trained"], row["skipped"], row["n_groups"] = (_count(r.get(k)) for k in ("trained", "skipped", "n_groups"))
        extra = _mapping(r.get("extra"))
        row["resends"] = int(_number(extra.get("resends")) or 0)
        for kind in ("down", "up"):  # model frames as they crossed the wire, in the run's codec
            row[f"wire_bytes_{kind}"] = _number(extra.get(f"wire_bytes_{kind}"))
        for way in ("sent", "received"):  # model payloads on the coordinator's link (boards too)
            row[f"server_bytes_{way}"] = _number(extra.get(f"server_bytes_{way}"))
        # each group model's accuracy over its clients (server/rounds.py), where there are groups
        row["group_accuracy"] = {
            k.removeprefix("group_acc_"): _number(v) for k, v in extra.items() if str(k).startswith("group_acc_")
        }
    last = rounds[-1] if rounds else {}
    planned = _count(_setting(doc, "rounds")) or None
    if round_in_progress is not None and planned is not None:
        round_in_progress = min(round_in_progress, planned)
    return {
        "run": {
            "strategy": str(_setting(doc, "strategy") or ""),
            "rounds_planned": planned,
            "rounds_done": len(rounds),
            "round_in_progress": round_in_progress,
            "status": status,
            "codec": str(_setting(doc, "codec") or "fp32"),
        },
        "fleet": fleet(doc, live),
        "rounds": curves,
        "groups": [[str(m) for m in g] for g in last.get("groups", []) if isinstance(g, list)],
        "plan": plan(last),
        "handoff": {str(k): _count(v) for k, v in (last.get("handoff") or {}).items()},
        "links": links(doc),
        "events": events(rounds, doc.get("run_events")),
        "progress": [],  # a live run's round, group by group (server/dashboard/feed.py)
    }
