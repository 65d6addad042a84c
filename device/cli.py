"""``covey-device``: run the device agent on a board (no TensorFlow, no server code)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from device.data import FORMATS
from device.errors import ConfigError, CoveyError
from device.mqtt import TlsFiles, check_tls_files, read_password_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Keys holding paths: a relative path in a config file is relative to the file's folder
# (so a site bundle works where it lies and wherever it is copied); a flag's is
# relative to the working directory, as usual.
PATH_KEYS = ("data", "test", "state_dir", "password_file", "ca_certs", "certfile", "keyfile")

CONFIG_KEYS = {
    "broker",
    "run",
    "id",
    "data",
    "user",
    "test",
    "state_dir",
    "username",
    "password",
    "password_file",
    "ca_certs",
    "certfile",
    "keyfile",
    "threads",
    "idle_timeout",
    "train_priority",
    "max_chunk",
}

# Below this the FEMNIST CNN (26 MB) would go as more than 400 frames, each with a
# 400-byte header, and a parallel round's uploads would crowd the coordinator's receive
# queue; brokers' packet limits (AWS IoT 128 KB, Azure IoT Hub 256 KB, EMQX 1 MB) are above it.
MIN_CHUNK = 65536
PRIORITY_ENV = "COVEY_TRAIN_PRIORITY"  # the training priority when neither flag nor config names one


# A reader that closes our stdout early (``covey strategies | head -3``) is the reader's
# choice, not a mistake: the command stops writing, quietly. It then exits with 141,
# 128 + SIGPIPE, the status the shell reports for cat, grep or any C tool that a
# closed pipe ends, so `set -o pipefail` scripts see covey as they see every other
# tool: not an error of the user (that is 2), and not 0, because the output was cut.
EXIT_BROKEN_PIPE = 141


def quiet_on_broken_pipe(body: Callable[[], int]) -> int:
    """Run a command's ``body``; when stdout's reader went away, stop without a word.

    The standard recipe (Python docs, "Note on SIGPIPE"): point stdout at devnull so
    that the interpreter's last flush does not fail again and print "Exception ignored".
    stdout is flushed here, inside the guard, for output still in its buffer; a
    ``SystemExit`` (``--help``) passes through the same flush.
    """
    try:
        try:
            return body()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout without a file descriptor (tests)
            pass
        return EXIT_BROKEN_PIPE


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line: what is wrong and where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _broker_address(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def parse_broker(text: str) -> tuple[str, int]:
    address = _broker_address(text)
    if address is None:
        raise ConfigError(f"--broker must be HOST:PORT with a port from 1 to 65535, got {text!r}")
    return address


def build_parser(prog: str = "covey-device") -> argparse.ArgumentParser:
    """The agent's flags; ``prog`` names it in help and error lines (``covey device run``
    when the ``covey`` command starts it)."""
    p = OneLineErrorParser(prog=prog, description="Run a covey device agent.")
    p.add_argument("--config", help="TOML file with any of the options below (flags override it)")
    p.add_argument("--broker", help="HOST:PORT of the MQTT broker (default: find the server with zeroconf)")
    p.add_argument("--run", help="run id (default: the one the server advertises)")
    p.add_argument("--id", help="device id (default: the host name)")
    p.add_argument("--data", help="local training data: LEAF .json file or folder, .npz or .csv")
    p.add_argument("--user", help="LEAF user id when the file holds several")
    p.add_argument("--test", help="local test data in the same format")
    p.add_argument("--state-dir", help="where the agent keeps its state and the model (default ~/.covey/device)")
    p.add_argument("--username")
    p.add_argument("--password", help="broker password (others can read it in the process list: use --password-file)")
    p.add_argument("--password-file", help="file holding the broker password (a site bundle's `password`)")
    p.add_argument("--ca-certs", help="CA bundle for TLS")
    p.add_argument("--certfile")
    p.add_argument("--keyfile")
    p.add_argument("--threads", type=int, help="interpreter threads (default: all CPUs)")
    p.add_argument(
        "--train-priority",
        choices=("idle", "normal"),
        help="CPU priority of training: 'idle' (default) yields to everything else on the board "
        f"(Linux SCHED_IDLE); 'normal' competes like any process (default from ${PRIORITY_ENV} if set)",
    )
    p.add_argument("--idle-timeout", type=float, help="leave after this many silent seconds")
    p.add_argument(
        "--max-chunk",
        type=int,
        metavar="BYTES",
        help="payload bytes per MQTT frame; a bigger model goes as several (default 900000: under a 1 MB "
        "broker packet limit). Lower it for a broker with a smaller limit",
    )
    p.add_argument(
        "--measure-link",
        action="store_true",
        help="print what this board can say about its link (Wi-Fi signal, noise, SNR, where from) and exit",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def measure_link_report() -> str:
    """What ``--measure-link`` prints: the Wi-Fi part of the agent's link report, each
    figure or "not available", and what needs the coordinator (RTT, goodput)."""
    from device.link import read_wifi

    wifi = read_wifi()

    def level(v: float | None, unit: str) -> str:
        return "not available" if v is None else f"{v:.1f} {unit}"

    lines = ["covey link report of this board (the Wi-Fi part of what the agent sends the coordinator)"]
    if wifi is None:
        lines.append("Wi-Fi: not available (no wireless interface in /proc/net/wireless, no iw, no termux-api)")
    else:
        lines += [
            f"interface: {wifi.interface} (read from {wifi.source})",
            f"signal: {level(wifi.signal_dbm, 'dBm')}",
            f"noise: {level(wifi.noise_dbm, 'dBm')}",
            f"SNR: {level(wifi.snr_db, 'dB')}",
        ]
    lines.append(
        "RTT and goodput to the server and to peers are measured when the coordinator asks "
        "(covey links shows the run's matrices)"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class Settings:
    """The agent's settings, each checked for type and range (``check_settings``)."""

    values: dict[str, Any]
    where: dict[str, str]  # how the user gave each key: "--threads" or "agent.toml: threads"

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def name(self, key: str) -> str:
        return self.where.get(key, "--" + key.replace("_", "-"))


def _settings(args: argparse.Namespace) -> Settings:
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    priority = os.environ.get(PRIORITY_ENV)
    if priority:  # below the config file and the flag: a service unit's or a test run's default
        values["train_priority"], where["train_priority"] = priority, PRIORITY_ENV
    if args.config:
        try:
            raw = tomllib.loads(Path(args.config).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {args.config} not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {args.config} ({exc}); give a readable TOML file") from None
        except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:  # also >4300-digit ints, deep nesting
            raise ConfigError(f"{args.config} is not valid TOML: {str(exc)[:200] or type(exc).__name__}") from None
        unknown = set(raw) - CONFIG_KEYS
        if unknown:
            raise ConfigError(f"{args.config}: unknown key(s) {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
        folder = Path(args.config).parent
        for key in PATH_KEYS:
            value = raw.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                raw[key] = str(folder / value)
        values.update(raw)
        where.update({key: f"{args.config}: {key}" for key in raw})
    for key in CONFIG_KEYS:
        flag = getattr(args, key, None)
        if flag is not None:
            values[key] = flag
            where[key] = "--" + key.replace("_", "-")
    for key, other in (("password", "password_file"), ("password_file", "password")):
        if getattr(args, key, None) is not None and not where.get(other, "--").startswith("--"):
            del values[other], where[other]  # a flag overrides the config's password in either form
    settings = Settings(values, where)
    check_settings(settings)
    return settings


def _shown(value: Any, flag: bool) -> str:
    """A value as the user wrote it: argv text for a flag, TOML for a config key."""
    if flag:
        return repr(value) if isinstance(value, str) else str(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def check_settings(s: Settings) -> None:
    """Every key's type and range, before anything is read, written or connected.
    The error names the flag, or the config file and key, the value, and the rule."""
    from device.protocol import check_id
    from device.worker import PRIORITIES

    def bad(key: str, rule: str) -> ConfigError:
        where = s.name(key)
        return ConfigError(f"{where} must be {rule}, got {_shown(s.get(key), where.startswith('--'))}")

    for key in sorted(s.values):
        value = s.get(key)
        if key == "threads":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, "an integer >= 1 (interpreter threads)")
        elif key == "max_chunk":
            if isinstance(value, bool) or not isinstance(value, int) or value < MIN_CHUNK:
                raise bad(key, f"an integer >= {MIN_CHUNK} (payload bytes per frame)")
        elif key == "idle_timeout":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise bad(key, "a number of seconds > 0")
        elif key == "train_priority":
            if value not in PRIORITIES:
                raise ConfigError(
                    f"{s.name(key)}: the training priority must be one of {', '.join(PRIORITIES)}, "
                    f"got {_shown(value, False)}"
                )
        elif not isinstance(value, str):
            raise bad(key, "a string" + (' "HOST:PORT"' if key == "broker" else ""))
        elif not value and key != "password":
            raise bad(key, "a non-empty string")
        elif key == "broker" and _broker_address(value) is None:
            raise bad(key, "HOST:PORT with a port from 1 to 65535, e.g. 192.168.1.10:1883")
        elif key in ("id", "run"):
            try:
                check_id(value)
            except CoveyError:
                raise bad(key, "1-64 printable characters without '/', '+', '#' or spaces") from None


def _existing_path(s: Settings, key: str, what: str) -> Path | None:
    value = s.get(key)
    if value is None:
        return None
    path = Path(value)
    if not path.exists():
        raise ConfigError(f"{s.name(key)} {path} does not exist; give {what}: {FORMATS}")
    return path


def _password(s: Settings) -> str | None:
    """The broker password: given as is, or read from ``password_file`` (not both)."""
    if s.get("password_file") is None:
        return s.get("password")
    if s.get("password") is not None:
        raise ConfigError(
            f"{s.name('password')} and {s.name('password_file')} both give the broker password; keep one of them"
        )
    return read_password_file(s.get("password_file"), s.name("password_file"))


def _tls(s: Settings) -> TlsFiles | None:
    """TLS is on when any TLS file is given (no CA file: the system's trusted CAs).
    Every file is loaded here, so a bad one is named before anything connects."""
    keys = ("ca_certs", "certfile", "keyfile")
    if all(s.get(key) is None for key in keys):
        return None
    tls = TlsFiles(s.get("ca_certs"), s.get("certfile"), s.get("keyfile"))
    check_tls_files(tls, {key: s.name(key) for key in keys})
    return tls


def main(argv: Sequence[str] | None = None, prog: str = "covey-device") -> int:
    """Run the agent. A mistake the user can fix is one line, ``PROG: error: ...``, and
    exit status 2."""
    return quiet_on_broken_pipe(lambda: _main(argv, prog))


def _main(argv: Sequence[str] | None, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    if args.measure_link:
        print(measure_link_report())
        return 0
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        from device.agent import Agent, AgentConfig, load_device_data
        from device.discovery import discover

        # Everything is checked before the agent reads its data, writes its state
        # folder or connects: a bad setting changes nothing on the board.
        s = _settings(args)
        data = _existing_path(s, "data", "the device's training data")
        if data is None:
            raise ConfigError("--data is required: the device's local training data")
        test = _existing_path(s, "test", "the device's test data")
        broker, run = s.get("broker"), s.get("run")
        if broker is not None and not run:
            raise ConfigError("--run is required with --broker")
        tls = _tls(s)
        password = _password(s)
        device_id = s.get("id") or socket.gethostname()
        state_dir = Path(s.get("state_dir") or Path.home() / ".covey" / "device" / device_id)
        if state_dir.exists() and not state_dir.is_dir():
            raise ConfigError(f"{s.name('state_dir')} {state_dir} is a file; give a folder for the agent's state")
        train, test_data = load_device_data(data, s.get("user"), test)
        if broker is not None:
            host, port = parse_broker(broker)
        else:
            host, port, run = discover(run)
        config = AgentConfig(
            device_id,
            run,
            host,
            port,
            state_dir,
            s.get("username"),
            password,
            tls,
            threads=s.get("threads"),
            train_priority=s.get("train_priority") or "idle",
            max_chunk=s.get("max_chunk") or AgentConfig.max_chunk,
        )
        try:
            agent = Agent(config, train, test_data)
        except OSError as exc:
            raise ConfigError(
                f"cannot use {state_dir} as the agent's state folder ({exc.strerror or exc}); "
                f"give another with {s.name('state_dir')}"
            ) from None
        signal.signal(signal.SIGTERM, lambda *_: setattr(agent, "running", False))
        try:
            agent.start()
            logging.getLogger("covey.device").info(
                "%s: connected to the broker at %s:%d%s as %s, run %s; waiting for the coordinator's model",
                device_id,
                host,
                port,
                " over TLS" if tls else "",
                s.get("username") or "an anonymous client",
                run,
            )
            agent.run_forever(idle_timeout=s.get("idle_timeout"))
        finally:
            agent.close()  # never raises, broker or not (device/mqtt.py)
        return 0
    except CoveyError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
