"""A site made and run without root: every file the current user's, mosquitto as that user.

Run by root (as in CI here), the test becomes the unprivileged user ``nobody`` with
``setpriv`` for both ``covey site init`` and mosquitto; run by anyone else, it is
that user already.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from server.broker import BrokerHandle, free_port, mosquitto_binary, wait_for_port
from server.site import load_site
from tests.site.conftest import SiteBroker

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.broker,
    pytest.mark.skipif(
        os.geteuid() == 0 and shutil.which("setpriv") is None,
        reason="running as root without setpriv (util-linux): cannot become an unprivileged user",
    ),
]


def as_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]


def test_a_site_made_without_root_is_the_users_and_its_broker_runs_as_that_user(site_parent: Path) -> None:
    # Prepare: a folder the unprivileged user owns
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    uid = pwd.getpwnam(user).pw_uid
    home = site_parent / "home"
    home.mkdir()
    if os.geteuid() == 0:
        os.chown(home, uid, -1)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(home)}
    tls_port, plain_port = free_port(), free_port()
    argv = [sys.executable, "-m", "covey.cli", "site", "init", str(home / "site"), "--ip", "127.0.0.1"]
    argv += ["--port", str(tls_port), "--loopback-port", str(plain_port), "--run", "siterun", "--devices", "d1"]

    # Execute
    made = subprocess.run(as_user(argv), env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    site = load_site(home / "site")
    conf = site.layout.broker_conf
    proc = subprocess.Popen(as_user([mosquitto_binary(), "-c", str(conf)]), stderr=subprocess.PIPE)
    try:
        wait_for_port("127.0.0.1", tls_port, 10, proc)
        broker = SiteBroker(site, BrokerHandle("127.0.0.1", tls_port, "mosquitto", proc))
        link = broker.connected("d1")
        link.publish("covey/siterun/from/d1/results", b"ok", wait=5)
        link.close()
    finally:
        proc.terminate()
        proc.wait(10)

    # Assert: every file is the user's, secrets readable by nobody else
    for path in [site.layout.root, *site.layout.root.rglob("*")]:
        st = path.stat()
        assert st.st_uid == uid, path
        if path.name in ("ca.key", "broker.key", "password", "passwords", "acl") or path.is_dir():
            assert stat.S_IMODE(st.st_mode) & 0o077 == 0, path
