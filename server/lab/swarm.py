"""Many real device agents in one process, each on its own MQTT connection: issue 28's
scale run (``bench/edge.py --scale``) puts 1,000 devices on a few of these.

``python -m server.lab.swarm --broker HOST:PORT --run RUN --first K --count N ...`` runs
devices ``s<K>`` to ``s<K+N-1>`` of a Synthetic(α, β) federation (generated here from
the seed, so every process of a swarm derives the same one), each a
:class:`~device.agent.Agent` with its own LiteRT interpreter, state folder and
:class:`~device.mqtt.MqttLink`, its request loop in a thread of its own: the protocol,
screening and deadlines are those of a board, only the processes are shared. It ends
when every agent's loop has ended (the coordinator's ``stop``, or ``--idle-timeout``) or
on SIGTERM, and prints how many agents it ran and how many of them trained.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from device.agent import Agent, AgentConfig
from device.cli import parse_broker
from device.errors import CoveyError
from server.simulation.datasets import synthetic

log = logging.getLogger("covey.swarm")


def swarm_ids(first: int, count: int) -> list[str]:
    """The device ids of a swarm's slice: ``s0000``, ``s0001``, ..."""
    return [f"s{k:04d}" for k in range(first, first + count)]


def federation_ids(total: int) -> list[str]:
    """Every device id of a swarm of ``total`` devices, in the federation's order."""
    return swarm_ids(0, total)


def run_swarm(args: argparse.Namespace) -> int:
    host, port = parse_broker(args.broker)
    data = synthetic(args.alpha, args.beta, args.total, seed=args.data_seed)
    users = list(data)  # the generator's order: device s<k> holds user k
    ids = swarm_ids(args.first, args.count)
    agents: list[Agent] = []
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    threads = []
    try:
        for k, device in zip(range(args.first, args.first + args.count), ids, strict=True):
            client = data[users[k]]
            config = AgentConfig(
                device, args.run, host, port, Path(args.state_dir) / device, threads=1, train_priority="normal"
            )
            agent = Agent(config, client.train, client.test)
            agent.start(connect_timeout=60.0)
            agents.append(agent)
            thread = threading.Thread(target=agent.run_forever, args=(args.idle_timeout,), daemon=True)
            thread.start()
            threads.append(thread)
        print(f"swarm: {len(agents)} agents connected to {args.broker}", flush=True)
        while not stop.is_set() and any(t.is_alive() for t in threads):
            stop.wait(1.0)
    finally:
        for agent in agents:
            agent.running = False
        for thread in threads:
            thread.join(timeout=10)
        for agent in agents:
            with contextlib.suppress(Exception):
                agent.close()
    tasks = [a.runner.trained if a.runner is not None else 0 for a in agents]
    print(f"swarm: {len(agents)} agents ran, {sum(t > 0 for t in tasks)} of them trained ({sum(tasks)} tasks)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m server.lab.swarm", description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True, metavar="HOST:PORT")
    p.add_argument("--run", required=True)
    p.add_argument("--first", type=int, required=True, help="the first device's index in the federation")
    p.add_argument("--count", type=int, required=True, help="devices in this process")
    p.add_argument("--total", type=int, required=True, help="devices in the whole federation")
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--state-dir", required=True, help="the agents' state folders go under it")
    p.add_argument("--idle-timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.first < 0 or args.count < 1 or args.first + args.count > args.total:
        last = args.first + args.count - 1
        print(f"swarm: error: devices {args.first}..{last} are not in 0..{args.total - 1}", file=sys.stderr)
        return 2
    try:
        return run_swarm(args)
    except CoveyError as exc:
        print(f"swarm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
