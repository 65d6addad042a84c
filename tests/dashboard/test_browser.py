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
    assert browser.title == f"covey: fedavg on {tmp_path.name}"  # onerror="document.title=1" never ran
    assert browser.find_element("id", "device-count").text == "3"
    assert browser.find_element("id", "last-server-accuracy").text == "40.00 %"
    assert browser.execute_script("return window.coveyCharts.accuracy.data[1].slice(-1)[0]") == 0.4
    # each group model's curve beside them (round 2's group accuracies), and the losses
    groups = browser.execute_script("return window.coveyCharts.accuracy.series.slice(3).map((s) => s.label)")
    assert groups == ["group 0", "group 1"]
    assert browser.execute_script("return window.coveyCharts.accuracy.data.slice(3).map((d) => d[1])") == [0.5, 0.25]
    assert browser.execute_script("return window.coveyCharts.loss.series.map((s) => s.label)") == [
        "round",
        "server",
        "training",
    ]
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
        wait_for(lambda: browser.find_element("id", "online-count").text == "6", 60, "six boards online")
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
    # the run is over: the page no longer claims to know who is online
    status = browser.find_element("id", "status")
    wait_for(lambda: "as it ended" in status.text, 30, f"the page to say the run ended: {status.text}")
    assert browser.find_element("id", "online-count").text == "–"
    # the coordinator's link: FedAvg's start model broadcast once, each board's model back (fp32)
    extra = results["rounds"][-1]["extra"]
    model = 4 * 433_726  # the FEMNIST MLP
    assert (extra["server_bytes_sent"], extra["server_bytes_received"]) == (model, 6 * model)
    received = browser.execute_script("return window.coveyCharts.bytes.data[2].slice(-1)[0]")
    assert received == pytest.approx(6 * model / 1e6)
    assert "coordinator's link" in browser.find_element("id", "bytes-chart").text
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


def test_a_live_page_says_what_a_chain_waits_on_and_when_it_lost_the_coordinator(browser: Any) -> None:
    # Prepare: a page served as a coordinator serves it, with round 3 of a chain under way
    # whose member dev001 went offline; link matrices over the plan's groups
    from server.dashboard.live import Address, DashboardServer, LiveView
    from server.dashboard.state import FleetEntry, page_state

    state = page_state(
        doc(), live=[FleetEntry("dev000", True, time.time()), FleetEntry("dev001", False, time.time() - 40)]
    )
    state["run"].update(status="running", round_in_progress=3)
    state["progress"] = [
        {
            "group": 0,
            "mode": "chain",
            "members": [["dev000", "done"], ["dev001", "waiting"]],
            "done": False,
            "deadline_in_s": 12,
        }
    ]
    ids = ["dev000", "dev001", HOSTILE]
    state["links"] = {
        "ids": ids,
        "snr_db": [[30.0, 12.5, 5.0], [12.5, 28.0, 4.0], [5.0, 4.0, 20.0]],
        "snr_source": [
            ["transfer", "measured", "reverse"],
            ["measured", "transfer", "measured"],
            ["reverse", "measured", "transfer"],
        ],
        "rtt_ms": [[0.0, 3.0, 40.0], [3.0, 0.0, 41.0], [40.0, 41.0, 0.0]],
        "rtt_source": None,
    }
    view = LiveView()
    view.publish(state)
    server = DashboardServer(view, Address("127.0.0.1", 0), "t").start()
    try:
        # Execute: open it and point at the Γ entry from dev000 to dev001
        browser.get(server.url)
        wait_for(lambda: browser.find_element("id", "online-count").text == "1", 20, "the live fleet")
        progress = browser.find_element("id", "progress").text
        canvas = browser.find_element("id", "snr-map")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
        cell, label = browser.execute_script("const c = arguments[0].coveyCell; return [c.size, c.label]", canvas)
        width = browser.execute_script("return arguments[0].getBoundingClientRect().width", canvas)
        scale = width / float(canvas.get_attribute("width"))
        from selenium.webdriver.common.action_chains import ActionChains

        # the page orders the boards by groups (dev001 is in none: last); offsets are from
        # the canvas centre (Selenium 4): dev000's row, dev001's column
        order = browser.execute_script("return arguments[0].coveyCell.order", canvas)
        x = (label + (order.index(1) + 0.5) * cell) * scale - width / 2
        y = (label + (order.index(0) + 0.5) * cell) * scale - width / 2
        ActionChains(browser).move_to_element_with_offset(canvas, int(x), int(y)).perform()
        readout = browser.find_element("id", "snr-hover").text
    finally:
        server.close()  # the coordinator goes away

    # Assert: the offline member is awaited, not training; the entry reads as words;
    # without its coordinator the page says so and no longer claims who is online
    assert "dev001 awaited (offline)" in progress and "deadline in 12 s" in progress
    assert readout == "dev000 → dev001: 12.5 dB (measured)"
    wait_for(lambda: "connection to the coordinator lost" in browser.find_element("id", "status").text, 20, "lost")
    assert browser.find_element("id", "online-count").text == "–"
    assert browser.find_elements("css selector", "#progress img, #plan img") == []
    keep_screenshot(browser, "dashboard-offline-member.png")
