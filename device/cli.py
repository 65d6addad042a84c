"""``covey-device``: run the device agent on a board (no TensorFlow, no server code)."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from device.errors import ConfigError, CoveyError
from device.mqtt import TlsFiles

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

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
    "ca_certs",
    "certfile",
    "keyfile",
    "threads",
    "idle_timeout",
    "train_priority",
}


def parse_broker(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--broker must be HOST:PORT, got {text!r}")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="covey-device", description="Run a covey device agent.")
    p.add_argument("--config", help="TOML file with any of the options below (flags override it)")
    p.add_argument("--broker", help="HOST:PORT of the MQTT broker (default: find the server with zeroconf)")
    p.add_argument("--run", help="run id (default: the one the server advertises)")
    p.add_argument("--id", help="device id (default: the host name)")
    p.add_argument("--data", help="local training data: LEAF .json file or folder, .npz or .csv")
    p.add_argument("--user", help="LEAF user id when the file holds several")
    p.add_argument("--test", help="local test data in the same format")
    p.add_argument("--state-dir", help="where the agent keeps its state and the model (default ~/.covey/device)")
    p.add_argument("--username")
    p.add_argument("--password")
    p.add_argument("--ca-certs", help="CA bundle for TLS")
    p.add_argument("--certfile")
    p.add_argument("--keyfile")
    p.add_argument("--threads", type=int, help="interpreter threads (default: all CPUs)")
    p.add_argument(
        "--train-priority",
        choices=("idle", "normal"),
        help="CPU priority of training: 'idle' (default) yields to everything else on the board "
        "(Linux SCHED_IDLE); 'normal' competes like any process",
    )
    p.add_argument("--idle-timeout", type=float, help="leave after this many silent seconds")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _settings(args: argparse.Namespace) -> dict[str, object]:
    values: dict[str, object] = {}
    if args.config:
        try:
            raw = tomllib.loads(Path(args.config).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {args.config} not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{args.config} is not valid TOML: {exc}") from None
        unknown = set(raw) - CONFIG_KEYS
        if unknown:
            raise ConfigError(f"{args.config}: unknown key(s) {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
        values.update(raw)
    for key in CONFIG_KEYS:
        flag = getattr(args, key, None)
        if flag is not None:
            values[key] = flag
    return values


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        from device.agent import Agent, AgentConfig, load_device_data
        from device.discovery import discover

        s = _settings(args)

        def opt(key: str) -> str | None:
            value = s.get(key)
            return None if value is None else str(value)

        data = opt("data")
        if data is None:
            raise ConfigError("--data is required: the device's local training data")
        broker, run = opt("broker"), opt("run")
        if broker is not None:
            host, port = parse_broker(broker)
            if not run:
                raise ConfigError("--run is required with --broker")
        else:
            host, port, run = discover(run)
        device_id = opt("id") or socket.gethostname()
        state_dir = Path(opt("state_dir") or Path.home() / ".covey" / "device" / device_id)
        test = opt("test")
        train, test_data = load_device_data(Path(data), opt("user"), Path(test) if test else None)
        ca = opt("ca_certs")
        tls = TlsFiles(ca, opt("certfile"), opt("keyfile")) if ca else None
        threads = int(str(s["threads"])) if s.get("threads") is not None else None
        config = AgentConfig(
            device_id,
            run,
            host,
            port,
            state_dir,
            opt("username"),
            opt("password"),
            tls,
            threads=threads,
            train_priority=opt("train_priority") or "idle",
        )
        agent = Agent(config, train, test_data)
        idle = float(str(s["idle_timeout"])) if s.get("idle_timeout") is not None else None
        signal.signal(signal.SIGTERM, lambda *_: setattr(agent, "running", False))
        agent.start()
        try:
            agent.run_forever(idle_timeout=idle)
        finally:
            agent.close()
        return 0
    except CoveyError as exc:
        print(f"covey-device: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
