"""A field site on this machine with emulated ARM boards in it, as docs/site-guide.md sets one up.

:class:`BoardSite` makes the site with ``covey site init`` (TLS, a password per board),
runs its broker with ``covey broker run --site``, and installs each board's bundle with
``firmware_scripts/provision-device.sh BUNDLE DATA TEST``: on an emulated board inside
it (``/etc/covey``, the board's own ``covey-device``), on a host agent under a prefix
of its own. :meth:`BoardSite.run` starts every agent with the command the script
printed, runs ``covey server run --site DIR ...`` to its end, stops the agents as
systemd would (SIGTERM) and returns what happened. Every board holds one FEMNIST
writer's data as ``.npz`` files, as a board's own data would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device.data import read_leaf
from device.errors import ConfigError
from server.broker import free_port, wait_for_port
from server.field.boards import GUEST_SOURCE, EmulatedBoard, Install
from server.field.lifecycle import OpenClose
from server.paths import REPO_ROOT

RUN = "field"
PROMPT = "run the agent with: "


@dataclass(frozen=True)
class BoardAgent:
    """An emulated board taking part in a site: its id, the board and its install."""

    device_id: str
    board: EmulatedBoard
    install: Install


@dataclass
class SiteRun:
    """One ``covey server run``: its exit status, output, results and every agent's log."""

    code: int
    output: str
    results: dict[str, Any]
    logs: dict[str, str] = field(default_factory=dict)


class BoardSite(OpenClose):
    """A site with emulated boards and host agents; a context manager."""

    def __init__(self, folder: Path, boards: Sequence[BoardAgent], host_ids: Sequence[str], femnist: Path) -> None:
        self.folder, self.boards, self.host_ids, self.femnist = folder, list(boards), list(host_ids), femnist
        self.site = folder / "site"
        self.port = free_port()
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
        self.commands: dict[str, list[str]] = {}
        self._broker: subprocess.Popen[bytes] | None = None
        self._agents: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def device_ids(self) -> list[str]:
        return [b.device_id for b in self.boards] + self.host_ids

    def covey(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "covey.cli", *argv]

    def open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o755)  # the broker drops to the mosquitto user, which must enter it
        init = ["site", "init", str(self.site), "--host", "localhost", "--ip", "127.0.0.1", "--port", str(self.port)]
        done = subprocess.run(
            self.covey(*init, "--run", RUN, "--devices", *self.device_ids),
            env=self.env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise ConfigError(f"covey site init failed: {done.stderr.strip()}")
        broker = self.covey("broker", "run", "--site", str(self.site))
        with (self.folder / "broker.log").open("wb") as log:
            self._broker = subprocess.Popen(broker, env=self.env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port("127.0.0.1", self.port, 20, self._broker)
        train, test = read_leaf(self.femnist / "train"), read_leaf(self.femnist / "test")
        for device, writer in zip(self.device_ids, list(train), strict=False):
            data = self.folder / "data" / device
            data.mkdir(parents=True)
            np.savez(data / "train.npz", x=train[writer].x, y=train[writer].y)
            np.savez(data / "test.npz", x=test[writer].x, y=test[writer].y)
        for agent in self.boards:
            self.commands[agent.device_id] = self._provision_board(agent)
        for device in self.host_ids:
            self.commands[device] = self._provision_host(device)

    def _provision_board(self, agent: BoardAgent) -> list[str]:
        """Copy the bundle and data to the board, then provision-device.sh there, as root on a board."""
        board, home = agent.board, f"/home/pi/{agent.device_id}"
        shutil.rmtree(board.path(home), ignore_errors=True)
        shutil.copytree(self.site / "devices" / agent.device_id, board.path(f"{home}/bundle"))
        for name in ("train.npz", "test.npz"):
            shutil.copy2(self.folder / "data" / agent.device_id / name, board.path(f"{home}/{name}"))
        script = f"{GUEST_SOURCE}/firmware_scripts/provision-device.sh"
        env = {"COVEY_DEVICE": agent.install.agent, "COVEY_SYSTEMD": "no"}
        argv = ["bash", script, f"{home}/bundle", f"{home}/train.npz", f"{home}/test.npz"]
        done = board.run(argv, timeout=300, env=env)
        return _printed_command(done, f"the {board.arch} board {agent.device_id}")

    def _provision_host(self, device: str) -> list[str]:
        env = {
            **self.env,
            "COVEY_PREFIX": str(self.folder / "hosts" / device),
            "COVEY_SYSTEMD": "no",
            "COVEY_DEVICE": str(Path(sys.executable).parent / "covey-device"),
        }
        data = self.folder / "data" / device
        script = REPO_ROOT / "firmware_scripts" / "provision-device.sh"
        argv = [str(script), str(self.site / "devices" / device), str(data / "train.npz"), str(data / "test.npz")]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        return _printed_command(done, f"host agent {device}")

    def run(self, *server_args: str, timeout: float = 1800) -> SiteRun:
        """Start every agent, run ``covey server run --site DIR *server_args`` to its end."""
        state = self.folder / f"state-{len(list(self.folder.glob('state-*')))}"
        logs = {d: self.folder / f"{state.name}-{d}.log" for d in self.device_ids}
        boards = {b.device_id: b for b in self.boards}
        try:
            for device, command in self.commands.items():
                with logs[device].open("wb") as log:
                    if device in boards:
                        self._agents[device] = boards[device].board.start(command, log)
                    else:
                        self._agents[device] = subprocess.Popen(
                            command, env=self.env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT
                        )
            argv = self.covey("server", "run", "--site", str(self.site), "--state-dir", str(state), *server_args)
            done = subprocess.run(argv, env=self.env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        finally:
            self._stop_agents()
        results_path = state / "results.json"
        results = json.loads(results_path.read_text()) if results_path.exists() else {}
        return SiteRun(
            done.returncode,
            done.stdout + done.stderr,
            results,
            {d: p.read_text(errors="replace") for d, p in logs.items() if p.exists()},
        )

    def _stop_agents(self) -> None:
        for proc in self._agents.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self._agents.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self._agents.clear()
        for agent in self.boards:
            agent.board.stop_all()

    def close(self) -> None:
        self._stop_agents()
        if self._broker is not None:
            if self._broker.poll() is None:
                self._broker.send_signal(signal.SIGTERM)
                try:
                    self._broker.wait(15)
                except subprocess.TimeoutExpired:
                    self._broker.kill()
                    self._broker.wait(10)
            self._broker = None


def _printed_command(done: subprocess.CompletedProcess[str], who: str) -> list[str]:
    """The agent command provision-device.sh printed (on a board without systemd)."""
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or PROMPT not in last:
        raise ConfigError(f"provision-device.sh on {who} failed: {(done.stderr or done.stdout).strip()[-600:]}")
    return last.split(PROMPT, 1)[1].split()
