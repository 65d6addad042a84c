"""The marks of a test that runs real brokers and agents in network namespaces
(server/field/netns.py): slow, needs mosquitto, and skipped with the reason where this
machine cannot create namespaces."""

from __future__ import annotations

import pytest

from server.field.netns import available

NETNS_OK, NETNS_WHY = available()
LAB_MARKS = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.skipif(not NETNS_OK, reason=f"this machine cannot create network namespaces: {NETNS_WHY}"),
]
