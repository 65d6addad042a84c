"""``covey field-test``: its report (pure functions over a results file) and every
mistake a user can make before a namespace exists (one line, exit status 2). The
whole command on an emulated site runs in tests/site/test_measured_links.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from covey.cli import main
from server.field.fieldtest import device_ids
from server.field.report import build_report, format_report, rtt_reduction_pct, star_matrices, time_to_target
from server.links import LinkMatrices
from server.simulation.topology import LinkProfile, Site, parse_topology

FAST, SLOW = Site("fast", 2, LinkProfile(50, 2)), Site("slow", 2, LinkProfile(5, 30, 0.1))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err, out.err
    return code, out.err


def _leaf(folder: Path, writers: int) -> Path:
    for split in ("train", "test"):
        (folder / split).mkdir(parents=True)
        users = {f"w{i}": {"x": [[0.0] * 784] * 2, "y": [i % 3, 1]} for i in range(writers)}
        doc = {"users": list(users), "num_samples": [2] * writers, "user_data": users}
        (folder / split / "data.json").write_text(json.dumps(doc))
    return folder


def test_random_groups_of_the_same_sizes_are_the_exact_reference() -> None:
    # Prepare: a symmetric RTT matrix and a grouping of unequal sizes
    rng = np.random.default_rng(0)
    rtt = rng.uniform(1, 100, (9, 9))
    rtt = (rtt + rtt.T) / 2
    np.fill_diagonal(rtt, 0)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2])

    # Execute: the closed form against many random groupings of these sizes
    pct = rtt_reduction_pct(rtt, labels)
    sampled = []
    for _ in range(4000):
        perm = rng.permutation(labels)
        sampled.append(sum(rtt[np.ix_(perm == g, perm == g)].sum() / 2 for g in range(3)))
    grouped = sum(rtt[np.ix_(labels == g, labels == g)].sum() / 2 for g in range(3))

    # Assert
    assert pct == pytest.approx(100 * (1 - grouped / np.mean(sampled)), abs=1.0)


def test_through_one_broker_equal_groups_cannot_lower_the_summed_rtt() -> None:
    # In a star every pair's RTT is r_i + r_j: the sum over groups of one size is fixed
    r = np.array([2.0, 3, 5, 40, 60, 80])
    star = r[:, None] + r[None, :]
    np.fill_diagonal(star, 0)

    by_speed = rtt_reduction_pct(star, np.array([0, 0, 0, 1, 1, 1]))
    unequal = rtt_reduction_pct(star, np.array([0, 0, 0, 0, 1, 2]))  # the slow ones alone

    assert by_speed == pytest.approx(0.0, abs=1e-9)
    assert unequal > 20


def test_time_to_target_counts_the_rounds_up_to_the_first_that_reaches_it() -> None:
    assert time_to_target([0.1, math.nan, 0.5, 0.7], [2.0, 3.0, 4.0, 5.0], 0.5) == (3, 9.0)
    assert time_to_target([0.1, 0.2], [2.0, 3.0], 0.5) == (None, None)


def test_star_matrices_take_the_weaker_link_and_both_latencies() -> None:
    ids = ["f1", "f2", "s1", "s2"]
    site_of = {"f1": FAST, "f2": FAST, "s1": SLOW, "s2": SLOW}

    snr, rtt = star_matrices(ids, site_of, 20e6)

    assert rtt[0, 1] == 2 * (2 + 2) and rtt[0, 2] == 2 * (2 + 30) and rtt[2, 3] == 2 * 60
    assert snr[0, 0] > snr[2, 2] and snr[0, 2] == pytest.approx(snr[2, 3])  # the slow link bounds both
    assert np.allclose(snr, snr.T) and np.allclose(rtt, rtt.T)


def test_report_compares_measured_links_with_the_topology() -> None:
    # Prepare: a run's results.json as the coordinator writes it, links measured per site
    ids = ["f1", "f2", "s1", "s2"]
    site_of = {"f1": FAST, "f2": FAST, "s1": SLOW, "s2": SLOW}
    snr, rtt = star_matrices(ids, site_of, 20e6)
    measured = LinkMatrices(
        tuple(ids), 20e6, snr - 1.0, np.full((4, 4), "measured", dtype=object), rtt + 5.0,
        np.full((4, 4), "measured", dtype=object),
    )  # fmt: skip
    rounds = [{"server_accuracy": a, "wall_s": 10.0, "groups": [["f1", "f2"], ["s1", "s2"]]} for a in (0.2, 0.4, 0.6)]
    doc = {"rounds": rounds, "links": measured.to_dict()}
    counts = {d: np.array([5, 1]) if d[0] == "f" else np.array([1, 5]) for d in ids}

    # Execute
    report = build_report(doc, site_of, strategy="dsc", bandwidth_hz=20e6, class_counts=counts, target=0.4)

    # Assert
    assert (report.final_accuracy, report.best_accuracy, report.rounds_to_target) == (0.6, 0.6, 2)
    assert report.time_to_target_s == 20.0 and report.mean_round_s == 10.0
    assert report.group_site_ari == 1.0 and report.dsc_primary_site_ari == 1.0
    assert report.snr_rank_corr > 0.9 and report.rtt_rank_corr > 0.9
    rows = {s.site: s for s in report.sites}
    assert rows["fast"].measured_snr_db == pytest.approx(rows["fast"].topology_snr_db - 1.0, abs=0.01)
    assert rows["slow"].measured_rtt_ms == pytest.approx(rows["slow"].topology_rtt_ms + 5.0, abs=0.01)
    assert report.sources["snr"] == {"measured": 16}


def test_device_ids_follow_the_sites_and_stay_topic_safe() -> None:
    topology = parse_topology(
        {"site": [{"name": "far corner/2", "devices": 2, "bandwidth_mbps": 1}, {"name": "lab", "devices": 1,
                                                                                  "bandwidth_mbps": 9}]}
    )  # fmt: skip

    ids = [d for d, _ in device_ids(topology)]

    assert ids == ["far_corner_2-01", "far_corner_2-02", "lab-01"]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--strategy", "nope"], ["unknown strategy 'nope'"]),
        (["--strategy", "fedavg", "--set", "bogus=1"], ["--set bogus", "fedavg takes"]),
        (["--strategy", "fedavg", "--rounds", "0"], ["--rounds must be >= 1"]),
        (["--strategy", "fedavg", "--target", "150"], ["--target", "percent"]),
        (["--strategy", "fedavg", "--timeout", "-5"], ["--timeout must be > 0"]),
        (["--strategy", "fedavg", "--epochs", "0"], ["--epochs must be >= 1"]),
        (["--strategy", "fedavg", "--central"], ["--central is for a topology with [[edge]] sites"]),
    ],
)
def test_setting_mistakes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needles: list[str]
) -> None:
    code, err = _run(capsys, "field-test", "examples/topologies/office.toml", *extra, "--out", str(tmp_path / "o"))

    assert code == 2 and len(err.splitlines()) == 1, err
    assert all(n in err for n in needles), err
    assert not (tmp_path / "o").exists()


def test_a_topology_or_data_that_cannot_be_used_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a missing file, an inconsistent one, data with too few writers, --out a file
    bad = tmp_path / "bad.toml"
    bad.write_text("[[site]]\nname = 'a'\ndevices = 2\nbandwidth_mbps = -3\n")
    small = _leaf(tmp_path / "leaf", 3)
    taken = tmp_path / "taken"
    taken.write_text("")
    cases = [
        ([str(tmp_path / "none.toml")], ["none.toml", "cannot read it"]),
        ([str(bad)], ["bandwidth_mbps must be a number"]),
        (["examples/topologies/office.toml", "--data-dir", str(small)], ["has 12 devices", "only 3 writers"]),
        (["examples/topologies/office.toml", "--out", str(taken)], ["is a file"]),
        (["examples/topologies/office.toml", "--data-dir", str(tmp_path)], ["needs train/ and test/"]),
    ]
    for args, needles in cases:
        # Execute
        code, err = _run(capsys, "field-test", *args, "--strategy", "fedavg")

        # Assert
        assert code == 2 and len(err.splitlines()) == 1, (args, err)
        assert all(n in err for n in needles), (args, err)


@pytest.mark.parametrize("unscored", [math.nan, None])  # a results.json writes null since strict JSON
def test_a_report_reads_back_from_its_json(unscored: float | None) -> None:
    site_of = {"f1": FAST, "s1": SLOW}
    doc = {"rounds": [{"server_accuracy": unscored, "wall_s": 1.0}, {"server_accuracy": 0.5, "wall_s": 2.0}]}
    report = build_report(doc, site_of, strategy="fedavg", bandwidth_hz=20e6, target=0.9)

    text = json.dumps(report.to_dict(), allow_nan=False)  # strict JSON: nothing measured is null
    back = type(report).from_dict(json.loads(text))

    assert back.accuracy[1] == 0.5 and math.isnan(back.accuracy[0]) and math.isnan(back.snr_rank_corr)
    assert back.time_to_target_s is None and back.rounds == 2 and back.target == 0.9
    assert [s.site for s in back.sites] == [s.site for s in report.sites] and back.to_dict() == report.to_dict()


def test_a_report_keeps_the_links_bytes_of_every_round_or_none() -> None:
    site_of = {"f1": FAST, "s1": SLOW}
    doc = {"rounds": [{"server_accuracy": 0.1, "wall_s": 1.0}, {"server_accuracy": 0.2, "wall_s": 1.0}]}
    per_round = {"down": [3_000_000, 1_000_000], "up": [1_000_000, 1_000_000]}
    both = {role: per_round for role in ("devices", "coordinator", "broker")}

    kept = build_report(doc, site_of, strategy="fedavg", bandwidth_hz=20e6, link_bytes=both)
    short = {role: {way: v[:1] for way, v in ways.items()} for role, ways in both.items()}
    dropped = build_report(doc, site_of, strategy="fedavg", bandwidth_hz=20e6, link_bytes=short)

    assert kept.link_mb_per_round("devices") == 3.0  # (4 + 2) MB over two rounds
    assert type(kept).from_dict(json.loads(json.dumps(kept.to_dict()))).link_bytes == kept.link_bytes
    assert "devices 3.0 MB (all together), coordinator 3.0 MB, broker 3.0 MB" in format_report(kept, Path("out"))
    # a count that does not cover every round on record is not reported at all
    assert dropped.link_bytes == {} and math.isnan(dropped.link_mb_per_round("devices"))
    assert "on the links" not in format_report(dropped, Path("out"))


@pytest.mark.parametrize(("cut", "said"), [(40.0, "40 % below"), (-12.0, "12 % above"), (math.nan, "n/a")])
def test_the_summary_says_whether_the_groups_rtt_is_below_or_above_random_groups(cut: float, said: str) -> None:
    doc = {"rounds": [{"server_accuracy": 0.1, "wall_s": 1.0, "groups": [["f1"], ["s1"]]}]}
    report = build_report(doc, {"f1": FAST, "s1": SLOW}, strategy="fedavg", bandwidth_hz=20e6)
    report.rtt_reduction_pct = cut
    assert f"intra-group RTT {said} random groups of these sizes" in format_report(report, Path("out"))
