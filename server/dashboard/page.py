"""The dashboard page: one HTML skeleton, filled by ``static/dashboard.js``.

Live (``covey server run --dashboard``), the page loads its scripts from the
coordinator's dashboard server and listens to ``/events``. As a report (``covey
report RUN_DIR``) it is one file: the same scripts and styles inline and the state
embedded as JSON, so it opens with no server and no internet. Scripts and charts
(uPlot 1.6.31, MIT, vendored under ``static/vendor/``) ship with covey; nothing is
fetched from elsewhere.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STATIC = Path(__file__).resolve().parent / "static"
UPLOT = "vendor/uplot-1.6.31"
SCRIPTS = (f"{UPLOT}/uPlot.iife.min.js", "dashboard.js")
STYLES = (f"{UPLOT}/uPlot.min.css", "dashboard.css")

BODY = """<header>
  <h1 id="title"></h1>
  <p id="status" class="status"></p>
</header>
<main>
  <section id="fleet-panel">
    <h2>Fleet: <span id="device-count">0</span> boards, <span id="online-count">0</span> online</h2>
    <table id="fleet"><thead><tr><th>board</th><th>arch</th><th>interpreter</th><th>online</th><th>last seen</th>
    <th>train s</th><th>peak MB</th><th>CPU °C</th><th>throttled</th><th>refusals</th></tr></thead>
    <tbody></tbody></table></section>
  <section id="round-panel"><h2>Round <span id="round">0</span> of <span id="rounds-planned">?</span></h2>
    <p id="round-detail"></p><ul id="progress"></ul>
    <p>last round's plan (its groups run side by side; a chain trains in the order shown):</p>
    <ol id="plan"></ol>
    <div id="strategy-groups" hidden><p>the strategy's groups:</p><ol id="groups"></ol></div></section>
  <section id="learning-panel"><h2>Learning</h2>
    <p>last server accuracy <b id="last-server-accuracy">–</b>, federated <b id="last-federated-accuracy">–</b></p>
    <p id="group-accuracy"></p>
    <div id="accuracy-chart"></div><div id="loss-chart"></div><div id="bytes-chart"></div></section>
  <section id="links-panel"><h2>Links</h2><p id="links-note"></p>
    <div class="heatmaps">
      <figure><figcaption>Γ, effective SNR: <span id="snr-caption">dB</span></figcaption>
        <canvas id="snr-map" width="420" height="420"></canvas><p id="snr-hover" class="hover"></p></figure>
      <figure><figcaption>RTT: <span id="rtt-caption">ms</span></figcaption>
        <canvas id="rtt-map" width="420" height="420"></canvas><p id="rtt-hover" class="hover"></p></figure>
    </div></section>
  <section id="events-panel"><h2>Events</h2><ul id="events"></ul></section>
</main>"""


def _skeleton(title: str, head: str, tail: str) -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1"><link rel=icon href="data:,">'
        f"<title>{html.escape(title)}</title>{head}</head><body>\n{BODY}\n{tail}</body></html>\n"
    )


def live_page(title: str) -> str:
    """The page the dashboard server sends: scripts and styles from ``/static/``."""
    head = "".join(f'<link rel=stylesheet href="/static/{s}">' for s in STYLES)
    tail = f'<div id="page-title" hidden>{html.escape(title)}</div>' + "".join(
        f'<script src="/static/{s}"></script>' for s in SCRIPTS
    )
    return _skeleton(title, head, tail)


def embedded_json(state: Mapping[str, Any]) -> str:
    """``state`` as JSON safe inside a ``<script>`` element: no ``<``, ``>`` or ``&``
    can end it or start markup (they become ``\\u003c`` and so on)."""
    text = json.dumps(state, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _inline_script(name: str) -> str:
    """A script's text safe inside ``<script>``: ``</`` becomes ``<\\/`` (the same in JS)."""
    return (STATIC / name).read_text().replace("</", "<\\/")


def report_page(title: str, state: Mapping[str, Any]) -> str:
    """One self-contained file: scripts, styles and the state inline."""
    head = "".join(f"<style>{(STATIC / s).read_text()}</style>" for s in STYLES)
    tail = f'<div id="page-title" hidden>{html.escape(title)}</div>'
    tail += f'<script type="application/json" id="covey-state">{embedded_json(state)}</script>'
    tail += "".join(f"<script>{_inline_script(s)}</script>" for s in SCRIPTS)
    return _skeleton(title, head, tail)
