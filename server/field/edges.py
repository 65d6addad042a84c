"""A field test's edges (``[[edge]]`` in a topology): each site's gateway host.

The gateway sits on the lab's main network (the broker's and the coordinator's) with its
uplink: ``tbf`` on its veth for the bandwidth (:meth:`~server.field.netns.Lab.shape`),
and a :class:`~server.field.relay.Relay` on the gateway for the latency, jitter and loss.
Its site's boards sit on a network of their own (one bridge per site) and reach only the
gateway, at :data:`EDGE_PORT` on its address there. What the gateway runs there:

* ``edge`` mode: a mosquitto for the room (:func:`edge_config_text`: anonymous, like the
  lab's central broker, and bridged to the central broker through the uplink relay with
  the topic mapping of a site's edge, :func:`server.site.edge.bridge_topics`), and
  ``covey edge run --broker`` beside it, which runs the groups the coordinator places
  there (``server/edge/``);
* ``central`` mode: only the uplink relay, listening where the room's broker would: every
  message of the room crosses the uplink to the central broker, as on a site without an
  edge, over the same links.

A field test is a rehearsal of the network, not of the site's security: the brokers take
anonymous clients (the TLS site with its bridge credentials and ACLs is tested in
``tests/site/test_edge.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from server.site.edge import BRIDGE_OPTIONS, bridge_topics, edge_user

EDGE_PORT = 1883  # the room's broker (or, centrally, the uplink relay) on the gateway's room address
UPLINK_RELAY_PORT = 1884  # on the gateway's loopback: the edge broker's bridge dials it


class EdgeMode(Enum):
    """What a field test's gateways do: run the room's broker and groups, or forward."""

    EDGE = "edge"
    CENTRAL = "central"


def edge_config_text(
    run: str, name: str, devices: Sequence[str], *, listen: str, uplink: str, port: int = EDGE_PORT
) -> str:
    """A room's mosquitto.conf in a field test: an anonymous listener on the room's
    address (for its boards and the edge host) and the bridge to the central broker at
    ``uplink`` (``host:port``, the uplink relay)."""
    lines = [
        f"# the edge {name} of a field test: the room's broker, bridged to the central one over the uplink",
        f"listener {port} {listen}",
        "allow_anonymous true",
        "persistence false",
        "message_size_limit 0",
        "max_inflight_messages 64",
        "max_queued_messages 10000",
        "set_tcp_nodelay true",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "",
        "connection central",
        f"address {uplink}",
        f"remote_clientid {edge_user(name)}",
        f"local_clientid {edge_user(name)}.local",
        *BRIDGE_OPTIONS,
        *bridge_topics(run, name, devices),
    ]
    return "\n".join(lines) + "\n"
