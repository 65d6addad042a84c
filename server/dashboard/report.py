"""``covey report RUN_DIR``: a finished run's dashboard as one HTML file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from device.errors import ConfigError
from device.state import atomic_write
from server.dashboard.page import report_page
from server.dashboard.state import page_state


def results_of(path: Path) -> tuple[Path, dict[str, object]]:
    """The ``results.json`` of a run's state dir (or the file itself), parsed; a
    missing or unreadable file is one :class:`ConfigError` naming it."""
    if not path.exists():
        raise ConfigError(f"{path} does not exist; give a run's --state-dir or --out folder, or its results file")
    # a folder: its results.json, else another results file (a simulation's output folder),
    # never the live page's state file a coordinator keeps beside them
    others = [p for p in sorted(path.glob("*.json")) if p.name != "dashboard-state.json"] if path.is_dir() else []
    candidates = [path] if path.is_file() else [path / "results.json", *others]
    for candidate in candidates:
        if candidate.is_file():
            try:
                doc = json.loads(candidate.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ConfigError(f"{candidate}: not a run's results ({exc})") from None
            if isinstance(doc, dict) and isinstance(doc.get("rounds"), list):
                return candidate, doc
            if candidate == path:
                raise ConfigError(f"{candidate}: not a run's results (no 'rounds' list)")
    raise ConfigError(f"{path}: no results.json here; give a run's --state-dir or --out folder, or the file")


def report_title(doc: Mapping[str, Any], source: Path) -> str:
    """As the live page's title (``covey: STRATEGY on RUN``) where the results name the
    run (a coordinator's do), else the strategy and the results' folder or file."""
    settings = doc.get("settings")
    value = {}
    if isinstance(settings, Mapping):
        for key in ("strategy", "run"):
            entry = settings.get(key)
            if isinstance(entry, Mapping) and isinstance(entry.get("value"), str):
                value[key] = entry["value"]
    strategy = value.get("strategy", "a run")
    where = value.get("run") or (source.parent.name if source.name == "results.json" else source.stem)
    return f"covey: {strategy} on {where}"


def write_report(path: Path, out: Path | None = None) -> Path:
    """Write the report of the run at ``path`` to ``out`` (default: ``report.html``
    beside its results) and return where it went."""
    source, doc = results_of(path)
    target = out or source.with_name("report.html")
    title = report_title(doc, source)
    try:
        page = report_page(title, page_state(doc))
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise ConfigError(f"{source}: not a run's results the page can show ({type(exc).__name__}: {exc})") from None
    atomic_write(target, page.encode())
    return target
