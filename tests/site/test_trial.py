"""docs/site-guide.md's "A trial on one machine", run command for command.

The commands are read from the guide's section itself, the placeholders filled in
(``DIR``, ``BOARDS``, ``EVAL``, ``STATE``; the install prefixes under a temporary
folder instead of ``/opt``; ``covey`` as the server install's ``covey``) and run with
bash as a user pastes them: both install scripts for real (pip, from the package index
and its cache), the site and its sample data, the broker, a loop of provision-device.sh
and one agent per board in the background, and the coordinator to its end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from server.paths import REPO_ROOT, femnist_dir

pytestmark = [pytest.mark.broker, pytest.mark.slow]
BOARD_IDS = ["trial-1", "trial-2", "trial-3"]


def trial_commands() -> list[str]:
    """Every line of the ```sh blocks of the guide's trial section, in order."""
    text = (REPO_ROOT / "docs" / "site-guide.md").read_text()
    section = text.split("## A trial on one machine", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```sh\n")[1:]]
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def fill(line: str, values: dict[str, str]) -> str:
    """The guide's placeholders and paths replaced by this test's."""
    line = re.sub(r"/opt/covey-server\b", values["server"], line)
    line = re.sub(r"/opt/covey\b", values["device"], line)
    if line.startswith("covey "):
        line = f"{values['server']}/venv/bin/covey " + line[len("covey ") :]
    for word in ("DIR", "BOARDS", "EVAL", "STATE"):
        line = re.sub(rf"\b{word}\b", values[word], line)
    return line


def test_the_trial_on_one_machine_runs_as_the_guide_tells_it(site_parent: Path) -> None:
    # Prepare: the guide's commands with this test's folders
    values = {
        "server": str(site_parent / "server-install"),
        "device": str(site_parent / "device-install"),
        "DIR": str(site_parent / "trial"),
        "BOARDS": str(site_parent / "trial-boards"),
        "EVAL": str(femnist_dir()),
        "STATE": str(site_parent / "runs" / "trial"),
    }
    commands = [fill(line, values) for line in trial_commands()]
    assert [c.split()[0].rsplit("/", 1)[-1] for c in commands] == [
        "install-server.sh", "install-device.sh", "covey", "covey", "covey", "for", "covey-device", "covey",
    ]  # fmt: skip
    install_server, install_device, init, sample, broker, provision, agent, server = commands
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installs, not this checkout
    background: list[subprocess.Popen[bytes]] = []

    def shell(line: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", line], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )

    def started(line: str, log: Path) -> None:
        with log.open("wb") as out:
            background.append(
                subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=REPO_ROOT, env=env, stdout=out, stderr=out)
            )

    # Execute
    outputs = {}
    try:
        for line in (install_server, install_device, init, sample):
            done = shell(line, 1800)
            assert done.returncode == 0, (line, done.stderr[-3000:])
            outputs[line] = done.stdout
        started(broker, site_parent / "broker.log")
        done = shell(provision, 300)
        assert done.returncode == 0, done.stderr
        # what the script printed, with /opt/covey as this test's install like every other line
        said = [ln.split("run the agent with: ", 1)[1] for ln in done.stdout.splitlines() if "run the agent" in ln]
        printed = [fill(line, values) for line in said]
        for device in BOARD_IDS:
            line = re.sub(r"\bID\b", device, agent)
            assert line in printed, (line, printed)  # the guide's agent command is the one the script printed
            started(line, site_parent / f"{device}.log")
        coordinator = shell(server, 900)
    finally:
        for proc in reversed(background):  # agents, then the broker: Ctrl-C, as the guide says
            proc.send_signal(signal.SIGINT)
        for proc in background:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()

    # Assert: five rounds, each training every board it planned (FedGSP's paper setting: three
    # groups of one, κ = 0.3 of them a round), all three boards registered and in the fleet
    assert coordinator.returncode == 0, coordinator.stderr[-3000:]
    results = json.loads((Path(values["STATE"]) / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3, 4, 5]
    for r in results["rounds"]:
        assert r["trained"] == r["participants"] >= 1 and r["skipped"] == 0, r
    assert set(results["devices"]) == set(BOARD_IDS)
    assert "3 boards: 3 x86_64 LiteRT" in coordinator.stdout
    writers = re.findall(r"writer (\S+),", outputs[sample])
    assert len(set(writers)) == 3
    assert "results.json" in coordinator.stdout + coordinator.stderr
