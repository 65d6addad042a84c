"""``bench/dashboard.py``: the live page of a real run, in a real browser (issue 30).

A mosquitto from the repo's config, 6 agent processes (FEMNIST writers), ``covey server
run --strategy fedavg --rounds 5`` as a user types it, once without ``--dashboard`` and
once with the page open in headless chromium (Debian's, through Selenium), alternated
``--repeats`` times. Prints:

* ``figure dashboard_update_latency_s = …``: the worst round's time from the
  coordinator writing the round to ``results.json`` (seen by polling it every 20 ms)
  to the page showing it (the page's own clock, ``window.coveyShownAt``); target ≤ 2;
* ``figure dashboard_console_errors = …``: the page's console errors (target 0);
* ``figure dashboard_devices_shown = …``: boards in the page's fleet table (6);
* ``figure dashboard_injection_escaped = …``: 1 when a report whose board id is an
  ``<img onerror=...>`` shows it as text and runs nothing;
* ``figure dashboard_coordinator_cpu_overhead_pct = …``: the coordinator process's CPU
  seconds (``os.wait4``) with the page open over those without, median of the repeats,
  as a percentage more; target ≤ 5.

Usage: ``python bench/dashboard.py [--repeats 2] [--screenshot docs/plots/dashboard.png]``
(the screenshot: the whole page while round 3 of the first run with it is recorded, the
picture in docs/site-guide.md)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from covey.paths import femnist_dir  # noqa: E402
from server.broker import start_mosquitto  # noqa: E402
from server.fleet import leaf_writers, start_fleet  # noqa: E402
from server.lab.browser import console_errors, headless_chromium  # noqa: E402

ROUNDS, DEVICES = 5, 6


def coordinator(broker: Any, run: str, state: Path, dashboard: bool) -> subprocess.Popen[bytes]:
    root = femnist_dir()
    argv = [sys.executable, "-m", "covey.cli", "server", "run", "--broker", broker.address, "--run", run]
    argv += ["--strategy", "fedavg", "--min-devices", str(DEVICES), "--rounds", str(ROUNDS)]
    argv += ["--clients-per-round", str(DEVICES), "--eval-data", str(root), "--state-dir", str(state)]
    argv += ["--register-timeout", "120"]
    if dashboard:
        argv += ["--dashboard", "127.0.0.1:0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    log = (state.parent / f"{state.name}.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def rounds_in(path: Path) -> int:
    try:
        return len(json.loads(path.read_text())["rounds"])
    except (OSError, ValueError, KeyError):
        return 0


def one_run(broker: Any, work: Path, tag: str, with_page: bool, screenshot: Path | None = None) -> dict[str, Any]:
    """One run; with the page: when each round was written and when the page showed it
    (and, given ``screenshot``, the whole page saved there once round 3 is shown)."""
    root = femnist_dir()
    run, state = f"dash-{tag}", work / tag
    written: dict[int, float] = {}
    shown: dict[str, float] = {}
    out: dict[str, Any] = {}
    with start_fleet(root, leaf_writers(root, DEVICES), run=run, host=broker.host, port=broker.port, log_dir=work):
        proc = coordinator(broker, run, state, with_page)
        driver = None
        try:
            if with_page:
                url_file = state / "dashboard-url"
                deadline = time.monotonic() + 60
                while not url_file.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                driver = headless_chromium(height=2400) if screenshot else headless_chromium()
                driver.get(url_file.read_text().strip())
            results = state / "results.json"
            while True:  # os.wait4, not poll(): the coordinator's own CPU time comes with its exit
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                n = rounds_in(results)
                if n and n not in written:
                    written[n] = time.time()
                if screenshot is not None and driver is not None and n >= 3:
                    shown_rounds = driver.execute_script("return document.body.dataset.rounds")
                    if int(shown_rounds or 0) >= 3:
                        # the whole page and no more: its content's height, plus the browser's frame
                        height = driver.execute_script(
                            "return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom"
                            " + window.scrollY) + 24 + window.outerHeight - window.innerHeight"
                        )
                        driver.set_window_size(1280, int(height))
                        driver.save_screenshot(str(screenshot))
                        screenshot = None
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                time.sleep(0.02)
            if driver is not None:
                shown = driver.execute_script("return window.coveyShownAt || {}")
                out["errors"] = console_errors(driver)
                out["devices"] = len(driver.find_elements("css selector", "#fleet tbody tr"))
        finally:
            if driver is not None:
                driver.quit()
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"the coordinator failed; see {state.parent / (state.name + '.log')}")
    out["cpu_s"] = usage.ru_utime + usage.ru_stime
    out["latency_s"] = [shown[str(r)] / 1000.0 - written[r] for r in written if str(r) in shown]
    return out


def injection_escaped(work: Path) -> int:
    """1 when a report's hostile board id shows as text and nothing of it runs."""
    from server.dashboard.report import write_report

    hostile = '<img src=x onerror="document.title=1">'
    doc = {
        "settings": {"strategy": {"value": "fedavg"}},
        "rounds": [{"round": 1, "server_accuracy": 0.5, "rejected": {hostile: 1}, "groups": [[hostile]]}],
        "devices": {hostile: {"platform": None, "telemetry": []}},
    }
    folder = work / "hostile"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(doc))
    page = write_report(folder)
    driver = headless_chromium()
    try:
        driver.get(page.as_uri())
        time.sleep(0.5)
        cells = [td.text for td in driver.find_elements("css selector", "#fleet tbody td:first-child")]
        images = driver.find_elements("css selector", "img")
        return int(cells == [hostile] and not images and driver.title != "1" and not console_errors(driver))
    finally:
        driver.quit()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="runs of each kind, alternated (default 2)")
    p.add_argument("--screenshot", type=Path, help="save the page at round 3 of the first run with it here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="covey-dashbench-") as tmp, start_mosquitto() as broker:
        work = Path(tmp)
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for i in range(args.repeats):
            for with_page in (False, True):
                shot = args.screenshot if with_page and i == 0 else None
                result = one_run(broker, work, f"{'page' if with_page else 'plain'}{i}", with_page, shot)
                runs[with_page].append(result)
                kind = "with" if with_page else "without"
                print(f"{kind} the page, run {i}: coordinator {result['cpu_s']:.2f} CPU s", flush=True)
        plain = statistics.median(r["cpu_s"] for r in runs[False])
        page = statistics.median(r["cpu_s"] for r in runs[True])
        latency = max(x for r in runs[True] for x in r["latency_s"])
        print(f"figure dashboard_update_latency_s = {latency:.3f}")
        print(f"figure dashboard_console_errors = {sum(len(r['errors']) for r in runs[True])}")
        print(f"figure dashboard_devices_shown = {min(r['devices'] for r in runs[True])}")
        print(f"figure dashboard_injection_escaped = {injection_escaped(work)}")
        print(f"figure dashboard_coordinator_cpu_overhead_pct = {100.0 * (page - plain) / plain:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
