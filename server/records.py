"""The one writer of a run's results: JSON, CSV and a PNG plot, for simulation and boards.

``<stem>.json`` holds every effective setting with where it came from (paper
default, covey default, preset, config file, flag), a summary, and one object per
round (:class:`~server.backend.RoundRecord`); ``<stem>.csv`` the rounds flattened;
``<stem>.png`` accuracy and loss against rounds. Files are written to a temporary
name, flushed to disk and renamed, so a crash never leaves a half-written result.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from device.state import atomic_write
from server.backend import RoundRecord
from server.settings import Setting


def headline(records: Sequence[RoundRecord]) -> tuple[str, list[tuple[int, float]]]:
    """The accuracy a run is judged by: federated where it was measured (what the
    papers report), else the server-side one. Returns its name and (round, value)."""
    for name in ("federated_accuracy", "server_accuracy"):
        points = [(r.round, float(getattr(r, name))) for r in records if math.isfinite(getattr(r, name))]
        if points:
            return name, points
    return "federated_accuracy", []


def summary(records: Sequence[RoundRecord], target: float | None = None) -> dict[str, Any]:
    name, points = headline(records)
    values = [v for _, v in points]
    out: dict[str, Any] = {
        "accuracy": name,
        "final": values[-1] if values else float("nan"),
        "best": max(values) if values else float("nan"),
        "best_round": points[int(np.argmax(values))][0] if values else None,
        "rounds": len(records),
        "wall_s": float(sum(r.wall_s for r in records)),
    }
    modelled = np.cumsum([r.t_round_s if np.isfinite(r.t_round_s) else 0.0 for r in records])
    elapsed = {r.round: float(t) for r, t in zip(records, modelled, strict=True)}
    out["modelled_s"] = float(modelled[-1]) if len(records) else 0.0  # sum of t_round_s (the topology's time)
    wire = [r.extra["wire_bytes"] for r in records if "wire_bytes" in r.extra]
    if wire:  # measured model frames (the simulator counts them)
        out["wire_bytes"] = float(sum(wire))
        out["wire_bytes_per_round"] = float(np.mean(wire))
        radio = [r.extra.get("wire_radio_bytes", r.extra["wire_bytes"]) for r in records if "wire_bytes" in r.extra]
        out["wire_radio_bytes"] = float(sum(radio))
        out["wire_radio_bytes_per_round"] = float(np.mean(radio))
    if target is not None:
        out["target"] = target
        reached = next((rnd for rnd, v in points if v >= target), None)
        out["rounds_to_target"] = reached
        out["modelled_s_to_target"] = elapsed.get(reached) if reached is not None else None
    return out


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update({f"{key}_{k}": v for k, v in value.items()})
        elif isinstance(value, list):  # ids; groups of ids as "a b;c d"; a plan as "chain a b;parallel c d"
            out[key] = ";".join(_cell(v) for v in value)
        else:
            out[key] = value
    return out


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, dict) and isinstance(value.get("members"), list):  # a planned group
        return " ".join([str(value.get("mode", "")), *(str(m) for m in value["members"])])
    return str(value)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def json_number(value: Any) -> float:
    """A number read back from a results JSON: ``null`` (not measured) as NaN."""
    return math.nan if value is None else float(value)


def strict_json_values(value: Any) -> Any:
    """``value`` with every NaN or infinity (a figure not measured, such as the accuracy
    of a round nobody scored) as ``None`` and numpy scalars as Python numbers, so the
    document is strict JSON: ``NaN`` is Python's extension, which ``jq``, browsers and
    most other readers refuse. Readers take ``null`` back as NaN where they need a number."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json_values(v) for v in value]
    return value


def run_document(
    *,
    records: Sequence[RoundRecord],
    settings: Mapping[str, Setting],
    links: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    run_events: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A run's ``results.json`` as plain JSON values (no NaN: ``None``): its settings,
    summary and rounds, and the links, boards and run events (resumed, reconnected)
    where given (:func:`write_run`)."""
    doc: dict[str, Any] = {
        "settings": {k: s.as_dict() for k, s in sorted(settings.items())},
        "summary": summary(records),
        "rounds": [asdict(r) for r in records],
    }
    if links is not None:
        doc["links"] = dict(links)
    if devices is not None:
        doc["devices"] = dict(devices)
    if run_events:
        doc["run_events"] = [dict(e) for e in run_events]
    plain: dict[str, Any] = json.loads(json.dumps(strict_json_values(doc), default=_json_default, allow_nan=False))
    return plain


def write_run(
    out_dir: Path,
    stem: str,
    *,
    records: Sequence[RoundRecord],
    settings: Mapping[str, Setting],
    title: str,
    plot: bool = True,
    links: Mapping[str, Any] | None = None,
    devices: Mapping[str, Any] | None = None,
    document: Mapping[str, Any] | None = None,
    run_events: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.csv`` and (with ``plot``) ``<stem>.png``;
    ``links``: the link matrices grouping used (:meth:`server.links.LinkMatrices.to_dict`);
    ``devices``: each board's platform and telemetry
    (:meth:`server.coordinator.registry.Registry.boards_record`); ``document``: the
    :func:`run_document` of these already built (the live dashboard shares it)."""
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("json", "csv", "png")}
    doc = document or run_document(
        records=records, settings=settings, links=links, devices=devices, run_events=run_events
    )
    rows = [asdict(r) for r in records]  # the CSV keeps NaN as nan
    text = json.dumps(doc, indent=1, allow_nan=False)
    atomic_write(paths["json"], (text + "\n").encode())
    flat = [_flat(r) for r in rows]
    keys = sorted({k for r in flat for k in r}, key=lambda k: (k != "round", k))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(flat)
    atomic_write(paths["csv"], buffer.getvalue().encode())
    if plot:
        plot_runs({stem: [records]}, paths["png"], title=title)
    else:
        del paths["png"]
    return paths


def plot_runs(runs: Mapping[str, Sequence[Sequence[RoundRecord]]], path: Path, title: str = "") -> None:
    """Accuracy and loss against rounds; several seeds of a run show mean and spread."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no global figure state

    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    acc_label = "accuracy (%)"
    for label, seeds in runs.items():
        name, _ = headline(seeds[0])
        acc_label = "federated test accuracy (%)" if name == "federated_accuracy" else "server-side test accuracy (%)"
        loss_name = name.replace("accuracy", "loss")
        n = min(len(r) for r in seeds)
        rounds = np.arange(1, n + 1)
        acc = np.array([[getattr(rec, name) * 100 for rec in r[:n]] for r in seeds], np.float64)
        loss = np.array([[getattr(rec, loss_name) for rec in r[:n]] for r in seeds], np.float64)
        for ax, values in ((axes[0], acc), (axes[1], loss)):
            keep = np.isfinite(values).all(0)
            if not keep.any():
                continue
            mean = values[:, keep].mean(0)
            (line,) = ax.plot(rounds[keep], mean, label=label, marker="o" if keep.sum() < 30 else None, ms=3)
            if len(seeds) > 1:
                ax.fill_between(
                    rounds[keep], values[:, keep].min(0), values[:, keep].max(0), alpha=0.2, color=line.get_color()
                )
    axes[0].set(xlabel="round", ylabel=acc_label, title=title)
    axes[1].set(xlabel="round", ylabel=acc_label.replace("accuracy (%)", "loss"))
    for ax in axes:
        if not ax.lines:  # no round was scored (federated_eval_every = 0)
            ax.text(0.5, 0.5, "no round scored", ha="center", va="center", transform=ax.transAxes)
    if axes[0].lines:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    atomic_write(path, buffer.getvalue())
