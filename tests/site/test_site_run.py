"""A whole field test on one machine, as docs/site-guide.md tells it: every part a process
started with the command a user types, over TLS with per-device credentials.

``covey site init`` makes the site; ``covey broker run --site DIR`` runs its mosquitto;
each board runs ``covey-device --config DIR/devices/ID/device.toml --data ...`` from its
bundle; ``covey server run --site DIR`` runs FedGSP for 2 rounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from covey.cli import main
from server.broker import free_port, wait_for_port
from server.fleet import leaf_writers, start_fleet
from tests.mqtt.conftest import femnist_root

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.broker, pytest.mark.slow]
DEVICES = ["pi-1", "pi-2", "pi-3", "pi-4"]


def test_a_site_runs_fedgsp_over_tls_with_per_device_credentials(site_parent: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the site, and its broker as `covey broker run` starts it
    site, root, port = site_parent / "site", femnist_root(), free_port()
    init = ["site", "init", str(site), "--host", "localhost", "--ip", "127.0.0.1", "--port", str(port)]
    assert main([*init, "--run", "field", "--devices", *DEVICES]) == 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    broker_log = (tmp_path / "broker.log").open("wb")
    broker = subprocess.Popen(
        [sys.executable, "-m", "covey.cli", "broker", "run", "--site", str(site)],
        cwd=REPO,
        env=env,
        stdout=broker_log,
        stderr=subprocess.STDOUT,
    )
    configs = [site / "devices" / d / "device.toml" for d in DEVICES]
    state = tmp_path / "state"
    try:
        wait_for_port("127.0.0.1", port, 15, broker)

        # Execute: the boards from their bundles, the coordinator from the site
        with start_fleet(root, leaf_writers(root, 4), run="", host="", port=0, configs=configs, log_dir=tmp_path):
            code = main(
                [
                    "server",
                    "run",
                    "--site",
                    str(site),
                    "--strategy",
                    "fedgsp",
                    "--min-devices",
                    "4",
                    "--rounds",
                    "2",
                    "--set",
                    "beta=1",
                    "--set",
                    "kappa=1.0",
                    "--set",
                    "growth=linear",
                    "--set",
                    "alpha=0",
                    "--handoff",
                    "direct",
                    "--eval-data",
                    str(root),
                    "--state-dir",
                    str(state),
                    "--register-timeout",
                    "120",
                ]
            )
    finally:
        broker.send_signal(signal.SIGTERM)  # what systemd or Ctrl-C does; mosquitto saves its sessions
        broker_status = broker.wait(15)
        broker_log.close()

    # Assert: the run finished both rounds with every device, hand-offs device to device
    assert code == 0
    assert broker_status == 0, (tmp_path / "broker.log").read_text()
    result = json.loads((state / "results.json").read_text())
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    assert all(r["trained"] == 4 and r["skipped"] == 0 for r in result["rounds"])
    assert all(0 < r["server_accuracy"] <= 1 for r in result["rounds"])
    assert all(r["handoff"].get("direct", 0) > 0 for r in result["rounds"])
    for device in DEVICES:  # each agent used its bundle: its own id, registered
        log = (tmp_path / f"dev{DEVICES.index(device):03d}.log").read_text()
        assert f"{device}: registered" in log, log[-2000:]
    assert (site / "broker" / "data" / "mosquitto.db").exists()  # persistence is on, inside the site
    assert "results.json" in capsys.readouterr().out
