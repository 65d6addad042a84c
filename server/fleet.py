"""A local fleet: device agents as separate processes on LEAF writers (demo, tests,
benchmarks). Each agent is ``python -m device.cli`` with its writer's data, exactly
as on a board."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from device.data import read_leaf

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Fleet:
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    device_ids: list[str] = field(default_factory=list)
    workdir: tempfile.TemporaryDirectory[str] | None = None
    commands: list[list[str]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def restart(self, index: int) -> None:
        """Start device ``index`` again, as a board reboots: same command, same state
        folder (what it held on disk survives); its log goes on in the same file."""
        if self.processes[index].poll() is None:
            self.processes[index].kill()
            self.processes[index].wait(10)
        handle = self.logs[index].open("ab")
        self.processes[index] = subprocess.Popen(
            self.commands[index], cwd=REPO, env=self.env, stdout=handle, stderr=subprocess.STDOUT
        )

    def stop(self, timeout: float = 10.0) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        for p in self.processes:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.workdir is not None:
            self.workdir.cleanup()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def leaf_writers(root: Path, n: int) -> list[str]:
    """The first ``n`` writers (file order) of a LEAF folder's train split."""
    users = list(read_leaf(root / "train"))
    if n > len(users):
        raise ValueError(f"{root} has {len(users)} writers, {n} requested")
    return users[:n]


def start_fleet(
    root: Path,
    writers: list[str],
    *,
    run: str,
    host: str,
    port: int,
    threads: int = 1,
    idle_timeout: float = 600.0,
    log_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    device_ids: list[str] | None = None,
    configs: list[Path] | None = None,
    scripts: dict[str, Path] | None = None,
    agent_args: Sequence[str] = (),
) -> Fleet:
    """One agent process per writer, its data read from the LEAF folder. Devices are
    named ``dev000``, ``dev001``, ... unless ``device_ids`` says otherwise.

    With ``configs`` (one per writer: a site bundle's ``device.toml``), each agent runs
    ``--config`` with it, which gives the broker, run, id and credentials (``host``,
    ``port`` and ``run`` are not passed); ``device_ids`` then only name the state
    folders and logs (give the ids the configs hold). A device named in ``scripts``
    runs that script (with covey-device's flags) instead of the agent: a deliberately
    broken or malicious agent for tests. ``agent_args``: more flags for every agent."""
    fleet = Fleet(workdir=tempfile.TemporaryDirectory(prefix="covey-fleet-"))
    assert fleet.workdir is not None
    base = Path(fleet.workdir.name)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", **(extra_env or {})}
    for i, writer in enumerate(writers):
        device_id = device_ids[i] if device_ids else f"dev{i:03d}"
        log = (log_dir or base) / f"{device_id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        where = ["--config", str(configs[i])] if configs else ["--broker", f"{host}:{port}", "--run", run]
        program = [str(scripts[device_id])] if scripts and device_id in scripts else ["-m", "device.cli"]
        cmd = [
            sys.executable,
            *program,
            *where,
            *([] if configs else ["--id", device_id]),
            "--data",
            str(root / "train"),
            "--test",
            str(root / "test"),
            "--user",
            writer,
            "--state-dir",
            str(base / device_id),
            "--threads",
            str(threads),
            "--idle-timeout",
            str(idle_timeout),
            "-v",
            *agent_args,
        ]
        handle = log.open("wb")
        fleet.processes.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT))
        fleet.device_ids.append(device_id)
        fleet.commands.append(cmd)
        fleet.logs.append(log)
    fleet.env = env
    return fleet
