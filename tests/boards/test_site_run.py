"""Emulated Raspberry Pi boards join a real TLS site beside host agents, as docs/site-guide.md says.

A 64-bit board (LiteRT, the default install) and a 32-bit one (tflite-runtime over
Debian's numpy) each get their bundle installed by ``provision-device.sh`` on the
board, run the ``covey-device`` command it prints, and train in ``covey server run
--site`` runs with two host agents: FedGSP with one chain of all four (its order
shuffled every round, so models pass between boards and hosts both ways), direct
hand-offs in fp32; then the same with ``--codec int8``. Every round trains every
board and skips none, and the server records what each board is.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from server.field.board_site import BoardAgent, BoardSite, SiteRun
from server.paths import femnist_dir
from tests.boards.conftest import Installed

pytestmark = [pytest.mark.boards, pytest.mark.broker, pytest.mark.slow]
BOARDS = {"pi-arm64": ("arm64", "litert"), "pi-armhf": ("armhf", "tflite-runtime")}
HOSTS = ["host-1", "host-2"]
ONE_CHAIN = ["--set", "beta=1", "--set", "kappa=1.0", "--set", "growth=linear", "--set", "alpha=0"]
# FedGSP shuffles the chain every round from the run's seed. With seed 1 the chains of
# rounds 1-3 are armhf-host1-arm64-host2, host2-arm64-host1-armhf, host1-host2-armhf-arm64:
# each board receives from a host agent and hands to one (seed 5, say, never hands a host's
# model to the arm64 board in three rounds). The test checks the hand-offs in the logs.
SEED = "1"


def fedgsp(rounds: int, *extra: str) -> list[str]:
    return [
        "--strategy", "fedgsp", "--min-devices", "4", "--rounds", str(rounds), *ONE_CHAIN,
        "--eval-data", str(femnist_dir()), "--register-timeout", "600", "--seed", SEED, *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def site(installed: Installed) -> Iterator[Callable[..., SiteRun]]:
    """The site, in a folder the broker's mosquitto user can enter (not pytest's 0700 one)."""
    agents = []
    for device, (arch, backend) in BOARDS.items():
        board, install = installed(arch, backend)  # type: ignore[arg-type]
        agents.append(BoardAgent(device, board, install))
    folder = Path(tempfile.mkdtemp(prefix="covey-board-site-"))
    os.chmod(folder, 0o755)
    try:
        with BoardSite(folder, agents, HOSTS, femnist_dir()) as running:
            yield running.run
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def senders_to(log: str) -> set[str]:
    """Who handed models to the agent whose log this is (``model for T arrived from S``)."""
    return set(re.findall(r"model for \S+ arrived from (\S+)", log))


def tails(run: SiteRun) -> str:
    """The end of the coordinator's output and of every agent's log, for a failure."""
    parts = [f"== coordinator\n{run.output[-1500:]}"]
    parts += [f"== {device}\n{log[-1500:]}" for device, log in run.logs.items()]
    return "\n".join(parts)


def assert_every_round_trained_everyone(run: SiteRun, rounds: int) -> None:
    assert run.code == 0, tails(run)
    records = run.results["rounds"]
    assert [r["round"] for r in records] == list(range(1, rounds + 1))
    for r in records:
        # the logs too: a board that missed a round says why only there
        assert r["trained"] == 4 and r["skipped"] == 0, f"{r}\n{tails(run)}"
        assert sorted(r["trained_ids"]) == sorted([*BOARDS, *HOSTS]), f"{r}\n{tails(run)}"
        assert 0 < r["server_accuracy"] <= 1


def test_arm_boards_train_every_round_of_a_fedgsp_chain_with_host_agents(site: Callable[..., SiteRun]) -> None:
    # Execute: 3 rounds, one chain of four, direct hand-offs
    run = site(*fedgsp(3, "--handoff", "direct"))

    # Assert: every round trained all four; models went board -> host and host -> board
    assert_every_round_trained_everyone(run, 3)
    assert all(r["handoff"].get("direct", 0) > 0 for r in run.results["rounds"])
    for board in BOARDS:
        log = run.logs[board]
        assert f"{board}: connected to the broker at localhost" in log and "over TLS" in log, log[-2000:]
        assert senders_to(log) & set(HOSTS), f"{board} never received a model from a host agent:\n{log[-3000:]}"
        assert any(board in senders_to(run.logs[h]) for h in HOSTS), f"no host agent received a model from {board}"
    # the boards said what they are, and how each round went on them
    devices = run.results["devices"]
    arm64, armhf = devices["pi-arm64"]["platform"], devices["pi-armhf"]["platform"]
    assert (arm64["machine"], arm64["backend"]) == ("aarch64", "ai_edge_litert")
    assert (armhf["machine"], armhf["backend"], armhf["backend_version"]) == ("armv7l", "tflite_runtime", "2.14.0")
    assert arm64["os"].startswith("Debian GNU/Linux 12") and "Raspberry Pi 4" in arm64["model"]
    for device in devices.values():
        assert [t["round"] for t in device["telemetry"]] == [1, 2, 3]
        assert all(t["peak_rss_mb"] > 0 for t in device["telemetry"])
    fleet = f"4 boards: 2 x86_64 LiteRT {devices['host-1']['platform']['backend_version']}, "
    fleet += f"1 aarch64 LiteRT {arm64['backend_version']}, 1 armv7l tflite-runtime 2.14.0"
    assert fleet in run.output, run.output[-2000:]


def test_arm_boards_train_every_round_of_an_int8_run(site: Callable[..., SiteRun]) -> None:
    # Execute: int8 deltas (hand-offs go through the coordinator)
    run = site(*fedgsp(2, "--codec", "int8"))

    # Assert
    assert_every_round_trained_everyone(run, 2)
    for board in BOARDS:
        assert "round 2" in run.logs[board], run.logs[board][-2000:]
