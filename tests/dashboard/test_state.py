"""The dashboard's state, server and report without a browser (issue 30)."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from urllib.error import HTTPError

import pytest

from covey.cli import main
from device.errors import ConfigError
from server.dashboard.live import Address, DashboardServer, LiveView, parse_address
from server.dashboard.page import embedded_json, report_page
from server.dashboard.state import FleetEntry, page_state

HOSTILE = '<img src=x onerror="document.title=1">'


def doc() -> dict:
    rounds = [
        {
            "round": 1,
            "server_accuracy": 0.2,
            "server_loss": 2.5,
            "train_loss": 2.9,
            "federated_accuracy": None,
            "trained": 3,
            "skipped": 0,
            "n_groups": 1,
            "rejected": {"dev001": 2},
            "dropped": {"bad frame": 2},
            "groups": [["dev000", "dev001"]],
            "extra": {},
        },
        {
            "round": 2,
            "server_accuracy": 0.4,
            "server_loss": 1.9,
            "train_loss": 2.1,
            "federated_accuracy": 0.35,
            "trained": 2,
            "skipped": 1,
            "n_groups": 2,
            "rejected": {"dev001": 1, HOSTILE: 1},
            "dropped": {},
            "groups": [["dev000"], [HOSTILE]],
            "skipped_ids": ["dev002"],
            "plan": [
                {"group": 0, "mode": "chain", "members": ["dev002", "dev000"]},
                {"group": 1, "mode": "parallel", "members": [HOSTILE]},
            ],
            "extra": {
                "retries": 1.0,
                "resends": 2.0,
                "wire_bytes_down": 4000.0,
                "wire_bytes_up": 3000.0,
                "group_acc_0": 0.5,
                "group_acc_1": 0.25,
            },
        },
    ]
    devices = {
        "dev000": {
            "platform": {"machine": "aarch64", "backend": "ai_edge_litert", "backend_version": "2.3.0"},
            "telemetry": [{"round": 2, "peak_rss_mb": 80.5, "cpu_temp_c": 51.0, "throttled": 0}],
            "train_seconds": [[1, 3.5], [2, 4.25]],
        },
        "dev001": {"platform": None, "telemetry": []},
    }
    settings = {"strategy": {"value": "fedavg", "source": "flag"}, "rounds": {"value": 5, "source": "flag"}}
    return {"settings": settings, "rounds": rounds, "devices": devices, "summary": {}}


def test_the_page_state_counts_refusals_per_board_and_lists_what_happened() -> None:
    state = page_state(doc(), live=[FleetEntry("dev000", True, 1.8e9), FleetEntry("dev001", False, None)])
    fleet = {b["id"]: b for b in state["fleet"]}
    assert set(fleet) == {"dev000", "dev001", HOSTILE}
    assert fleet["dev001"]["refusals"] == 3 and fleet["dev001"]["online"] is False
    assert fleet["dev000"]["machine"] == "aarch64" and fleet["dev000"]["backend"] == "ai_edge_litert 2.3.0"
    assert fleet["dev000"]["peak_rss_mb"] == 80.5 and fleet["dev000"]["last_seen_at"] == 1.8e9
    assert fleet["dev000"]["train_s"] == 4.25 and fleet["dev001"]["train_s"] is None  # its last round's
    assert state["run"]["rounds_done"] == 2 and state["run"]["rounds_planned"] == 5
    assert [r["server_accuracy"] for r in state["rounds"]] == [0.2, 0.4]
    wire = [(r["wire_bytes_down"], r["wire_bytes_up"]) for r in state["rounds"]]
    assert wire == [(None, None), (4000.0, 3000.0)]
    assert state["rounds"][1]["group_accuracy"] == {"0": 0.5, "1": 0.25}
    assert state["groups"] == [["dev000"], [HOSTILE]]
    planned = [(g["mode"], g["members"]) for g in state["plan"]]
    assert planned == [("chain", ["dev002", "dev000"]), ("parallel", [HOSTILE])]
    assert [r["resends"] for r in state["rounds"]] == [0, 2]
    kinds = [(e["round"], e["kind"]) for e in state["events"]]
    assert (1, "refused") in kinds and (2, "retries") in kinds and (2, "resends") in kinds
    assert {"round": 2, "kind": "skipped", "device": "dev002", "detail": "missed the deadline"} in state["events"]
    json.dumps(state, allow_nan=False)  # the page's JSON holds no NaN


@pytest.mark.parametrize("plan", [7, "chain", {"mode": "chain"}, [{"mode": "<b>", "members": "ab"}], [None]])
def test_a_malformed_plan_in_a_results_file_shows_no_plan(plan: object) -> None:
    broken = doc()
    broken["rounds"][-1]["plan"] = plan
    assert page_state(broken)["plan"] == []


def test_embedded_state_cannot_end_its_script_element() -> None:
    page = report_page("t", page_state(doc()))
    state_tag = page.split('id="covey-state">', 1)[1].split("</script>", 1)[0]
    assert "<" not in state_tag and HOSTILE in {b["id"] for b in json.loads(state_tag)["fleet"]}
    assert json.loads(embedded_json({"x": "</script>&"}))["x"] == "</script>&"


@pytest.mark.parametrize(
    ("text", "expected"), [("8080", Address("127.0.0.1", 8080)), ("0.0.0.0:9", Address("0.0.0.0", 9))]
)
def test_dashboard_addresses(text: str, expected: Address) -> None:
    assert parse_address(text) == expected
    assert parse_address("127.0.0.1:1").loopback and not parse_address("0.0.0.0:1").loopback


@pytest.mark.parametrize(
    ("text", "needle"),
    [("web", "takes \\[HOST:\\]PORT"), ("1:70000", "0-65535"), ("http://0.0.0.0:8080", "not an address to open")],
)
def test_a_bad_dashboard_address_is_one_line(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_address(text)


def test_the_live_view_wakes_a_stream_only_on_a_change() -> None:
    view = LiveView()
    view.publish({"a": 1})
    version, _ = view.current()
    view.publish({"a": 1})
    assert view.current()[0] == version
    got: list[tuple[int, str]] = []
    waiter = threading.Thread(target=lambda: got.append(view.wait_newer(version, 5.0)))
    waiter.start()
    view.publish({"a": 2})
    waiter.join(5.0)
    assert got and got[0][0] == version + 1 and json.loads(got[0][1]) == {"a": 2}


def test_off_loopback_every_request_needs_the_token() -> None:
    view = LiveView()
    view.publish(page_state(doc()))
    server = DashboardServer(view, Address("0.0.0.0", 0), "t").start()
    try:
        base = f"http://127.0.0.1:{server.address.port}"
        with pytest.raises(HTTPError) as refused:
            urllib.request.urlopen(f"{base}/state", timeout=5)
        assert refused.value.code == 403
        assert server.token and server.url.endswith(f"?token={server.token}")
        with urllib.request.urlopen(f"{base}/state?token={server.token}", timeout=5) as reply:
            assert json.loads(reply.read())["run"]["rounds_done"] == 2
        with pytest.raises(HTTPError) as outside:  # nothing beside the static folder is served
            urllib.request.urlopen(f"{base}/static/../live.py?token={server.token}", timeout=5)
        assert outside.value.code == 404
    finally:
        server.close()


def test_covey_report_writes_one_file_and_a_missing_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text(json.dumps(doc()))
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "uPlot" in page and "/static/" not in page and "http" not in page.split("<body>", 1)[1][:2000]
    assert f"wrote {tmp_path / 'report.html'}" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing does not exist" in err


def test_a_page_served_elsewhere_follows_the_coordinators_state_file(tmp_path: Path) -> None:
    # Prepare: a coordinator's feed keeps its state in a file (a field test's coordinator,
    # in its own namespace); the page's feed on the host follows that file
    from server.dashboard.feed import DashboardFeed, StateFile, StateFileFeed, Views

    path = tmp_path / "state" / "dashboard-state.json"
    path.parent.mkdir()
    coordinator_page, host_page = LiveView(), LiveView()
    feed = DashboardFeed(
        Views(coordinator_page, StateFile(path)), lambda: [FleetEntry("dev000", True, 1.8e9)], progress=lambda: []
    )
    follower = StateFileFeed(host_page, path)  # not started: the test reads the file itself

    # Execute: the run reaches round 3
    feed.set_results(doc())
    feed.set_status("running", 3)
    follower.read()

    # Assert: the host's page shows what the coordinator's shows, boards' online status too
    assert host_page.current()[1] == coordinator_page.current()[1]
    state = json.loads(host_page.current()[1])
    online = {b["id"]: b["online"] for b in state["fleet"]}
    assert state["run"]["round_in_progress"] == 3 and online == {"dev000": True, "dev001": None, HOSTILE: None}
    for broken in ('{"run": ', '{"run": {"status": NaN}}', "[" * 100_000, '{"rounds": []}'):
        path.write_text(broken)  # half-written, NaN, nested past any limit, not a page state
        follower.read()  # raises nothing: the last good state stays
        assert json.loads(host_page.current()[1])["run"]["round_in_progress"] == 3, broken[:20]


def test_a_coordinator_that_stopped_without_finishing_shows_as_stopped(tmp_path: Path) -> None:
    from server.dashboard.feed import DashboardFeed, StateFile, StateFileFeed

    path = tmp_path / "dashboard-state.json"
    feed = DashboardFeed(StateFile(path), lambda: [FleetEntry("dev000", True, 1.8e9)])
    feed.set_results(doc())
    feed.set_status("running", 3)  # and then it was killed
    host_page = LiveView()
    follower = StateFileFeed(host_page, path).start()
    follower.finish()
    state = json.loads(host_page.current()[1])
    assert state["run"]["status"] == "stopped" and state["run"]["round_in_progress"] is None
    assert {b["online"] for b in state["fleet"]} == {None} and state["run"]["rounds_done"] == 2
    feed.set_status("finished")  # a coordinator that finished says so itself
    follower = StateFileFeed(host_page, path).start()
    follower.finish()
    assert any(b["online"] is True for b in json.loads(host_page.current()[1])["fleet"])


def test_a_state_the_page_cannot_take_never_stops_the_run(caplog: pytest.LogCaptureFixture) -> None:
    from server.dashboard.feed import DashboardFeed

    view = LiveView()
    feed = DashboardFeed(view, lambda: [FleetEntry("dev000", True, float("nan"))])
    feed.set_results({"rounds": [{"round": 1, "server_accuracy": 0.5, "extra": {"retries": float("nan")}}]})
    feed.boards = lambda: (_ for _ in ()).throw(RuntimeError("registry changed size"))  # type: ignore[assignment]
    feed.publish()  # no exception reaches the coordinator's thread
    assert "could not show the run's state" in caplog.text
    assert json.loads(view.current()[1])["run"]["rounds_done"] == 1  # the last good state stays


def test_scripts_are_public_but_a_rebound_name_is_refused_on_loopback() -> None:
    view = LiveView()
    view.publish(page_state(doc()))
    remote = DashboardServer(view, Address("0.0.0.0", 0), "t").start()
    local = DashboardServer(view, Address("127.0.0.1", 0), "t").start()
    try:
        # off loopback: the page's own scripts need no token (the page is useless without them)
        with urllib.request.urlopen(f"http://127.0.0.1:{remote.address.port}/static/dashboard.js", timeout=5) as r:
            assert r.status == 200 and r.headers["Referrer-Policy"] == "no-referrer"
        # on loopback: a page whose name was rebound to 127.0.0.1 cannot read the run
        rebound = urllib.request.Request(
            f"http://127.0.0.1:{local.address.port}/state", headers={"Host": "evil.example"}
        )
        with pytest.raises(HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=5)
        assert refused.value.code == 403
        with urllib.request.urlopen(f"http://localhost:{local.address.port}/state", timeout=5) as r:
            assert json.loads(r.read())["run"]["rounds_done"] == 2
    finally:
        remote.close()
        local.close()
    DashboardServer(LiveView(), Address("127.0.0.1", 0), "t").close()  # never started: closes at once


def test_a_hand_edited_results_file_still_makes_a_report(tmp_path: Path) -> None:
    edited = doc()
    edited["links"] = {"ids": ["dev000", "dev001"], "snr_db": [[float("nan"), 3.0], ["x", 1.0]], "rtt_ms": None}
    edited["rounds"][0]["rejected"] = {"dev001": "many"}
    edited["rounds"][1]["extra"] = {"retries": "twice"}
    edited["settings"] = ["not", "a", "table"]
    (tmp_path / "results.json").write_text(json.dumps(edited))  # NaN as Python writes it
    assert main(["report", str(tmp_path)]) == 0
    state = json.loads(
        report_page("t", page_state(json.loads((tmp_path / "results.json").read_text())))
        .split('id="covey-state">', 1)[1]
        .split("</script>", 1)[0]
    )
    assert state["links"]["snr_db"] == [[None, 3.0], [None, 1.0]] and state["run"]["rounds_planned"] is None


def test_a_live_round_shows_who_it_waits_on() -> None:
    from server.dashboard.feed import DashboardFeed

    view = LiveView()
    waiting = [
        {
            "group": 0,
            "mode": "chain",
            "members": [["dev000", "done"], ["dev001", "waiting"]],
            "done": False,
            "deadline_in_s": 84,
        }
    ]
    feed = DashboardFeed(view, lambda: [], progress=lambda: waiting)
    feed.set_status("running", 1)
    assert json.loads(view.current()[1])["progress"] == waiting
    feed.set_status("finished")
    assert json.loads(view.current()[1])["progress"] == []


def test_the_runs_own_events_take_their_place_among_the_rounds() -> None:
    resumed = {**doc(), "run_events": [{"round": 2, "kind": "resumed", "detail": "from the checkpoint after round 1"}]}
    kinds = [(e["round"], e["kind"]) for e in page_state(resumed)["events"]]
    assert kinds.index((1, "refused")) < kinds.index((2, "resumed")) < kinds.index((2, "skipped"))


def test_a_rounds_progress_reads_its_group_managers() -> None:
    """RoundExecution.progress on the simulator's own managers: nothing between rounds;
    mid-round, each member's state in chain order and the deadline left."""
    from server.paths import ensure_model
    from server.simulation.datasets import synthetic
    from server.simulation.engine import Simulation
    from server.strategies import make_strategy
    from server.strategies.base import TrainConfig

    strategy = make_strategy("naivegsp", train=TrainConfig(1, 10, 0.01), beta=1, kappa=1.0)
    sim = Simulation(strategy, synthetic(1, 1, 4, seed=0), ensure_model("mclr_synthetic"), seed=0)
    sim.run(1)
    execution = sim.devices.execution
    assert execution.progress() == []  # the round is over
    manager = execution.managers[0]
    manager.done, manager.deadline = False, execution.clock() + 30.0  # as it stood mid-round
    manager.members[-1].reported = False
    manager.members[0].skipped = True
    (group,) = execution.progress()
    states = [state for _, state in group["members"]]
    assert group["mode"] == "chain" and states[0] == "skipped" and states[-1] == "waiting"
    assert [d for d, _ in group["members"]] == [m.device for m in manager.members]
    assert 0 < group["deadline_in_s"] <= 30


def test_a_reports_title_names_the_strategy_and_the_run_as_the_live_page_does(tmp_path: Path) -> None:
    from server.dashboard.report import report_title

    named = doc()
    named["settings"]["run"] = {"value": "site", "source": "flag"}
    assert report_title(named, tmp_path / "results.json") == "covey: fedavg on site"
    assert report_title(doc(), tmp_path / "results.json") == f"covey: fedavg on {tmp_path.name}"
    assert report_title({}, tmp_path / "fedavg_synthetic_seed0.json") == "covey: a run on fedavg_synthetic_seed0"


def test_on_every_interface_the_printed_address_is_one_another_laptop_can_open() -> None:
    from server.broker import advertised_host

    server = DashboardServer(LiveView(), Address("0.0.0.0", 0), "t").start()
    try:
        host = server.url.split("//", 1)[1].rsplit(":", 1)[0]
        assert host == advertised_host("0.0.0.0") and host != "0.0.0.0"
    finally:
        server.close()


def test_a_report_never_takes_the_live_pages_state_file_for_results(tmp_path: Path) -> None:
    from server.dashboard.feed import StateFile

    StateFile(tmp_path / "state" / "dashboard-state.json").publish(page_state(doc()))  # makes its folder
    from server.dashboard.report import write_report

    with pytest.raises(ConfigError, match=r"no results\.json here"):
        write_report(tmp_path / "state")
