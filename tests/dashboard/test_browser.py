"""The dashboard in a real headless browser (issue 30): a finished run's report with a
hostile board id, and a live run of real agents over a real broker."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from covey.cli import main
from server.dashboard.report import write_report
from server.fleet import leaf_writers, start_fleet
from tests.dashboard.conftest import console_errors, keep_screenshot
from tests.dashboard.test_state import HOSTILE, doc
from tests.mqtt.conftest import femnist_root

pytestmark = pytest.mark.slow


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def test_a_report_shows_a_hostile_board_id_as_text(browser: Any, tmp_path: Path) -> None:
    # Prepare: a run whose refusals name a board id that is markup
    (tmp_path / "results.json").write_text(json.dumps(doc()))
    page = write_report(tmp_path)

    # Execute
    browser.get(page.as_uri())
    wait_for(lambda: browser.execute_script("return document.body.dataset.rounds") == "2", 20, "the page to render")

    # Assert: the id is shown as its characters; no element came of it; the script ran clean
    rows = browser.find_elements("css selector", "#fleet tbody tr")
    assert [r.find_element("css selector", "td").text for r in rows] == sorted(["dev000", "dev001", HOSTILE])
    assert browser.find_elements("css selector", "#fleet img, #plan img, #groups img, #events img") == []
    plan = [li.text for li in browser.find_elements("css selector", "#plan li")]
    assert plan == ["group 0, chain of 2: dev002 → dev000", f"group 1, parallel of 1: {{{HOSTILE}}}"]
    assert browser.find_element("id", "strategy-groups").is_displayed()  # its groups are not the plan's
    assert "2 resend(s)" in browser.find_element("id", "round-detail").text
    assert browser.title == "covey: " + tmp_path.name  # onerror="document.title=1" never ran
    assert browser.find_element("id", "device-count").text == "3"
    assert browser.find_element("id", "last-server-accuracy").text == "40.00 %"
    assert browser.execute_script("return window.coveyCharts.accuracy.data[1].slice(-1)[0]") == 0.4
    assert console_errors(browser) == []
    keep_screenshot(browser, "dashboard-report.png")


@pytest.mark.broker
def test_the_live_page_follows_a_run_of_six_boards(browser: Any, broker: Any, tmp_path: Path) -> None:
    # Prepare: six agents; the coordinator with its page on a free loopback port
    run, root, state = "dash-live", femnist_root(), tmp_path / "state"
    argv = ["server", "run", "--broker", broker.address, "--run", run, "--strategy", "fedavg", "--min-devices", "6"]
    argv += ["--rounds", "3", "--clients-per-round", "6", "--eval-data", str(root), "--state-dir", str(state)]
    argv += ["--register-timeout", "120", "--dashboard", "127.0.0.1:0"]
    codes: list[int] = []
    printed: list[str] = []

    def serve() -> None:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            codes.append(main(argv))
        printed.append(out.getvalue())

    with start_fleet(root, leaf_writers(root, 6), run=run, host=broker.host, port=broker.port, log_dir=tmp_path):
        coordinator = threading.Thread(target=serve, daemon=True)
        coordinator.start()
        url = wait_for_url(state)
        browser.get(url)
        wait_for(lambda: browser.find_element("id", "device-count").text == "6", 120, "six boards on the page")
        keep_screenshot(browser, "dashboard-live-fleet.png")
        wait_for(lambda: browser.execute_script("return document.body.dataset.rounds") == "3", 300, "round 3")
        coordinator.join(120)

    # Assert: the page's last point is results.json's, every board shown, no console error
    assert codes == [0], printed
    results = json.loads((state / "results.json").read_text())
    last = results["rounds"][-1]["server_accuracy"]
    assert browser.execute_script("return window.coveyCharts.accuracy.data[1].slice(-1)[0]") == pytest.approx(last)
    assert browser.find_element("id", "last-server-accuracy").text == f"{100 * last:.2f} %"
    assert browser.find_element("id", "round").text == "3"
    assert len(browser.find_elements("css selector", "#fleet tbody tr")) == 6
    planned = results["rounds"][-1]["plan"]  # FedAvg: one parallel group of every board
    assert [(g["mode"], len(g["members"])) for g in planned] == [("parallel", 6)]
    shown = browser.find_element("css selector", "#plan li").text
    assert shown.startswith(f"group {planned[0]['group']}, parallel of 6: {{") and planned[0]["members"][0] in shown
    assert console_errors(browser) == []
    keep_screenshot(browser, "dashboard-live.png")


URL_FILE = "dashboard-url"


def wait_for_url(state: Path) -> str:
    """The page's address, as the coordinator wrote it in its state folder."""
    path = state / URL_FILE
    wait_for(path.exists, 60, "the dashboard's address")
    return path.read_text().strip()
