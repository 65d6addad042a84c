"""Links measured on an emulated network, through ``covey field-test`` as a user runs it
(docs/links.md, "Field tests"): 3 sites x 4 boards, each site's links to the broker
shaped to a clearly different bandwidth with ``tbf`` (site c also delayed by the relay),
the broker and the coordinator on their own hosts. Nothing tells covey the topology:
``covey server run`` measures Γ and RTT, stores them in results.json, and DSC's primary
groups on the measured Γ are the three sites (adjusted Rand index 1.0). After the round,
Γ's diagonal is the goodput of the models the devices uploaded, timed by the server:
it matches each site's shaped bandwidth where an upload lasts long enough to time.

Everything runs in network namespaces the command creates and removes, also on failure.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from covey.cli import main
from server.field.netns import leftovers
from tests.lab_marks import LAB_MARKS

REPO = Path(__file__).resolve().parents[2]
pytestmark = LAB_MARKS


def watch_page(state_dir: Path, seen: list[dict], timeout: float = 600.0) -> None:
    """Read the field test's live page state (``/state``) every half second until it
    shows a recorded round or the page goes away."""
    deadline = time.monotonic() + timeout
    url_file = state_dir / "dashboard-url"
    while not url_file.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    base = url_file.read_text().strip().split("?")[0]
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "state", timeout=5) as reply:
                seen.append(json.loads(reply.read()))
        except OSError:
            if seen:
                return  # the test is over
        if seen and seen[-1]["run"]["rounds_done"] >= 1:
            return
        time.sleep(0.5)


def test_dsc_groups_the_sites_from_measured_links_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: the command of docs/links.md ("Field tests"), with an output folder, a
    # target, and the live page (issue 30), read as the test runs
    argv = ["field-test", str(REPO / "examples/topologies/lab.toml"), "--strategy", "dsc", "--rounds", "1"]
    argv += ["--target", "0.5", "--out", str(tmp_path / "field"), "--dashboard", "127.0.0.1:0"]
    page_states: list[dict] = []
    watcher = threading.Thread(target=watch_page, args=(tmp_path / "field" / "state", page_states), daemon=True)
    watcher.start()

    # Execute
    code = main(argv)
    watcher.join(30)

    # Assert: the report, the matrices it came from, and nothing left behind
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "DSC's primary segment on the measured Γ: site ARI 1.00" in out
    report = json.loads((tmp_path / "field" / "field.json").read_text())
    assert report["dsc_primary_site_ari"] == 1.0, report["sites"]
    assert report["rounds"] == 1 and report["time_to_target_s"] is not None  # 0.5 %: any model that learned at all
    links = json.loads((tmp_path / "field" / "state" / "results.json").read_text())["links"]
    ids = links["ids"]
    assert [i[0] for i in ids] == ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    src = np.array(links["snr_source"], dtype=object)
    off = ~np.eye(len(ids), dtype=bool)
    # every entry measured, or (a probe lost or timed implausibly fast) the other direction's
    assert set(src[off]) <= {"measured", "reverse"}, links["counts"]
    assert (src[off] == "measured").mean() >= 0.9, links["counts"]
    # the diagonal: the round's uploads at each site's shaped rate (tbf: 128, 32, 8 Mbit/s).
    # The MLP's upload is timed from its first chunk to its second: 0.18 and 0.73 s apart
    # at 32 and 8 Mbit/s, each site's median within 25 %; at 128 Mbit/s 45 ms, less than a
    # busy coordinator's stamping can time (links.MIN_RATE_INTERVAL_S; it read 1.3 to 5.6 times
    # the link), so site a keeps its probe, unless a late last chunk stretched an upload
    # past the floor. Either way site a reads faster than site b.
    diagonal = np.diag(src)
    assert (diagonal[4:] == "transfer").all() and set(diagonal[:4]) <= {"measured", "transfer"}, links["counts"]
    upload_bps = links["bandwidth_hz"] * np.log2(1 + 10 ** (np.diag(np.array(links["snr_db"], float)) / 10))
    site_bps = np.median(upload_bps.reshape(3, 4), axis=1)
    error = np.abs(site_bps[1:] / np.array([32e6, 8e6]) - 1)
    assert (error < 0.25).all(), (upload_bps / 1e6).round(1)
    assert site_bps[0] > site_bps[1], (upload_bps / 1e6).round(1)
    # DSC's primary segment above is on the probes it grouped on (results.json: links.probed)
    assert links["probed"]["counts"]["snr"] == {"measured": 144}, links["probed"]["counts"]
    by_site = {s["site"]: s for s in report["sites"]}
    snr = [by_site[s]["measured_snr_db"] for s in "abc"]
    assert snr[0] > snr[1] > snr[2], by_site  # the faster the link, the higher its SNR
    assert by_site["c"]["measured_rtt_ms"] > by_site["a"]["measured_rtt_ms"], by_site  # the relay's latency shows
    assert report["snr_rank_corr"] > 0.5 and report["rtt_rank_corr"] > 0.5, report
    assert (tmp_path / "field" / "field.png").stat().st_size > 0
    # the page followed the test from this machine: round 1 with its 12 boards and links
    shown = [s for s in page_states if s["run"]["rounds_done"] == 1]
    assert shown and len(shown[-1]["fleet"]) == 12 and shown[-1]["links"]["ids"] == ids, page_states[-1:]
    # as its coordinator (in its own namespace) saw them: the 12 boards online, the round in progress
    assert any([b["online"] for b in s["fleet"]] == [True] * 12 for s in page_states), page_states[-1:]
    assert any(s["progress"] and s["run"]["round_in_progress"] == 1 for s in page_states), page_states[-1:]
    # what the links carried in the round: every device got a start model and sent its
    # model back (float32, 4 bytes a weight), and in a star all of it crossed the broker's
    # link, which carried what the devices and the coordinator sent and received
    traffic = report["link_bytes"]
    model = 4 * 433_726  # the FEMNIST MLP, the default model
    assert all(len(traffic[role][way]) == 1 for role in traffic for way in ("down", "up")), traffic
    assert traffic["devices"]["down"][0] > 12 * model and traffic["devices"]["up"][0] > 12 * model, traffic
    for into_broker, out_of_it in (("up", "down"), ("down", "up")):
        others = traffic["devices"][into_broker][0] + traffic["coordinator"][into_broker][0]
        assert abs(traffic["broker"][out_of_it][0] / others - 1) < 0.02, traffic
    assert "on the links per round, both ways: devices" in out
    prefix = re.search(r"network namespaces (\S+)\*", out)
    assert prefix is not None, out[:2000]
    assert not [n for n in leftovers() if n.startswith(prefix.group(1))], leftovers()
