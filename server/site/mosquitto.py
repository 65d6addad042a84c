"""What the site's mosquitto reads: the password file, the ACL and the configuration.

**Passwords** are in mosquitto's own ``$7$`` format (PBKDF2-SHA512, 101 iterations,
a 12-byte salt; what ``mosquitto_passwd`` writes since 2.0), computed here so that a
site can be made on a machine without mosquitto.

**The ACL** binds identities to topics with mosquitto's pattern lines. How mosquitto
combines them (``security_default.c``): a client is checked against the ``topic``
lines under its own ``user`` line and then against every ``pattern`` line (patterns
apply to every user, whatever ``user`` line they follow); any ``deny`` match refuses,
else any match that grants the access allows, else the access is refused. ``%u`` is
replaced by the client's user name, and mosquitto refuses a pattern match for a user
name holding ``+`` or ``#``. So a device's writes are pattern lines with ``%u`` (the
user name of a device is its id; patterns also apply to the coordinator, harmlessly),
its reads of what the server publishes for everyone are ``topic`` lines under its own
``user`` line (a pattern without ``%u`` would work too, but mosquitto warns about each
on every start), and the coordinator's user has one ``topic`` line for everything.
What a device may do:

* write ``covey/<run>/from/<its id>/{register,results,frames,status}`` and
  ``covey/<run>/device/<any>/frames/from/<its id>`` (a hand-off in its own name), in the
  site's run only, nothing else: not the server's topics (``device/<id>/inbox``,
  ``device/<id>/frames``, ``device/<id>/assignment``, ``artifact/#``, ``shared/#``,
  ``server/status``), not another device's ``from/``, not another run's topics;
* read ``covey/<run>/device/<its id>/#``, ``artifact/#``, ``shared/#`` and
  ``server/status``; not another device's inbox.

A denied publish is dropped silently under MQTT 3.1.1 (the client still gets its
PUBACK); a denied subscription is refused in the SUBACK, and every delivery is checked
again against the read rules, so a wildcard subscription delivers only what may be read.

**The configuration** turns on ``use_username_as_clientid``: the broker replaces every
client id by the user name, so nobody can take over another client's session or kick
the coordinator by connecting with its client id.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

COORDINATOR = "coordinator"  # the coordinator's user name at every site
PBKDF2_ITERATIONS = 101  # mosquitto_passwd's default for $7$
SALT_BYTES = 12

# Writes are patterns: %u binds them to the user name (= the device id); {run} is the site's run.
DEVICE_WRITES = (
    *(f"pattern write covey/{{run}}/from/%u/{kind}" for kind in ("register", "results", "frames", "status")),
    "pattern write covey/{run}/device/+/frames/from/%u",
    "pattern read covey/{run}/device/%u/#",
)
# What a broker holds is bounded (issue 26: a board with valid credentials took mosquitto
# to 2,669 MB with 16 MiB frames). covey's frames carry at most 900,000 payload bytes
# (device/protocol/frames.py DEFAULT_MAX_CHUNK), so no packet needs more than 1 MiB.
MAX_PACKET_BYTES = 1_048_576
MAX_QUEUED_BYTES = 256 * 2**20  # per client, beyond what is in flight
DEFAULT_MEMORY_MB = 256
# Reads of what the server publishes for everyone, under each device's user line (a
# pattern without %u works too, but mosquitto warns about it on every start).
DEVICE_READS = (
    "topic read covey/{run}/artifact/#",
    "topic read covey/{run}/shared/#",
    "topic read covey/{run}/server/status",
)


def new_password() -> str:
    """A random password: 128 bits, URL-safe characters (no quoting needed anywhere)."""
    return secrets.token_urlsafe(16)


def hash_password(password: str, salt: bytes | None = None) -> str:
    """mosquitto's ``$7$`` hash of ``password``: ``$7$<iterations>$<salt b64>$<sha512 b64>``."""
    salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, PBKDF2_ITERATIONS, 64)
    return f"$7${PBKDF2_ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``hashed`` (a ``$7$`` entry) is the hash of ``password``."""
    parts = hashed.split("$")
    if len(parts) != 5 or parts[1] != "7":
        return False
    salt, digest = base64.b64decode(parts[3]), base64.b64decode(parts[4])
    return secrets.compare_digest(hashlib.pbkdf2_hmac("sha512", password.encode(), salt, int(parts[2]), 64), digest)


def password_line(user: str, password: str) -> str:
    return f"{user}:{hash_password(password)}\n"


def acl_text(run: str, devices: Sequence[str], edges: Sequence[Sequence[str]] = ()) -> str:
    """The site's ACL: the coordinator reads and writes ``covey/#``; each device only
    what carries its own id, and what the server publishes for every device; each edge's
    bridge (``edges``: its lines, :func:`server.site.edge.central_acl_lines`) what its
    room's boards may."""
    lines = [
        f"# ACL of the covey site {run!r}, written by `covey site init` and `covey site add-device`.",
        "# Identity is bound by the broker: a device's user name is its id, and it may write",
        "# only topics carrying that id (docs/protocol.md, 'Topics and identity').",
        "",
        "# Every user (pattern lines apply to all; %u is the user name, the device id): its own topics.",
        *(line.format(run=run) for line in DEVICE_WRITES),
        "",
        "# The coordinator, and its group managers: everything under covey/.",
        f"user {COORDINATOR}",
        "topic readwrite covey/#",
    ]
    for device in devices:
        lines += ["", f"user {device}", *(line.format(run=run) for line in DEVICE_READS)]
    for edge in edges:
        lines += ["", "# An edge's bridge: what its room's boards may write and read.", *edge]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BrokerFiles:
    """Absolute paths of what mosquitto reads, as they will be where it runs."""

    ca_cert: Path
    cert: Path
    key: Path
    passwords: Path
    acl: Path
    persistence: Path


def config_text(
    run: str,
    files: BrokerFiles,
    *,
    port: int,
    loopback_port: int | None,
    client_certs: bool,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> str:
    """mosquitto.conf for the site. It sets no pid file and no log destination, so it
    also works as ``/etc/mosquitto/conf.d/covey.conf`` under the distribution's
    ``mosquitto.conf`` (which sets both) and logs to stderr when run on its own."""
    lines = [
        f"# mosquitto for the covey site {run!r}, written by `covey site init`",
        "# (`covey broker run --site DIR` runs it in the foreground; firmware_scripts/broker-setup.sh",
        "# installs it as /etc/mosquitto/conf.d/covey.conf for the systemd service).",
        "",
        "# Every listener: passwords and the ACL. Each listener also takes the user name as the client",
        "# id, so nobody can take over another client's session or kick the coordinator by reusing",
        "# its client id (a listener option in mosquitto 2.0: before any listener it would open 1883).",
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {files.passwords}",
        f"acl_file {files.acl}",
        "",
        "# Sessions and queued messages survive a restart of the broker.",
        "persistence true",
        f"persistence_location {files.persistence}/",
        "autosave_interval 60",
        "max_inflight_messages 64",
        "",
        "# Bounds: no single board can make the broker grow without limit (a packet over the limit",
        "# disconnects its sender; a full queue drops what comes next for that client; past",
        "# memory_limit mosquitto refuses the message and disconnects its sender). covey's frames",
        "# carry at most 900,000 payload bytes. The coordinator clears what boards retain beyond",
        "# their status (server/coordinator/retained.py).",
        f"max_packet_size {MAX_PACKET_BYTES}",
        "max_queued_messages 10000",
        f"max_queued_bytes {MAX_QUEUED_BYTES}",
        f"memory_limit {memory_mb * 2**20}",
        "",
        "# Small messages (requests, probes, acknowledgements) leave at once, not after an ACK (Nagle).",
        "set_tcp_nodelay true",
        "",
        f"# TLS for the LAN: boards and the coordinator on port {port}.",
        f"listener {port}",
        f"cafile {files.ca_cert}",
        f"certfile {files.cert}",
        f"keyfile {files.key}",
        f"require_certificate {'true' if client_certs else 'false'}",
        "use_username_as_clientid true",
    ]
    if client_certs:
        lines.insert(len(lines) - 2, "# a client certificate signed by the site's CA, on top of the password")
    if loopback_port is not None:
        lines += [
            "",
            "# Plain MQTT on this machine only (a coordinator on the broker host); passwords still apply.",
            f"listener {loopback_port} 127.0.0.1",
            "use_username_as_clientid true",
        ]
    return "\n".join(lines) + "\n"
