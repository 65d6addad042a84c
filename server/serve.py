"""Run a coordinator from the command line (``covey server run``) and the demo.

Every setting is checked before the broker is touched: the strategy's parameters,
its training (the method's paper values unless set), rounds, and that
``--min-devices`` is enough for the strategy. The run shows a progress bar and one
log line per round, writes ``results.json`` / ``results.csv`` every round and
``results.png`` at the end (one writer for simulation and boards,
:mod:`server.records`), advertises the run with zeroconf (``--advertise``), and
resumes from the last checkpoint (``--resume``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from device.data import Dataset, read_leaf
from device.errors import ConfigError
from server.coordinator.config import CoordinatorConfig
from server.coordinator.coordinator import Coordinator
from server.dashboard.live import keep_url
from server.records import run_document, write_run
from server.run_config import RunConfig, resolve_run
from server.settings import Setting, Source
from server.strategies.base import Strategy, TrainConfig

log = logging.getLogger("covey.server")
RESULTS_STEM = "results"


@dataclass
class ServeOptions:
    """What ``covey server run`` runs: the run's learning settings (``learning``, the
    same typed model ``covey simulate`` fills), the coordinator's own settings
    (``coordinator``, passed on whole: its seed, codec, screening and evaluation
    schedule are taken from ``learning`` when the run is prepared) and what the
    command adds around them."""

    coordinator: CoordinatorConfig
    learning: RunConfig
    model_path: Path
    min_devices: int
    eval_dir: Path | None = None
    register_timeout: float = 300.0
    resume: bool = False
    advertise: bool = False
    advertise_host: str | None = None  # the broker host boards are told (None: the coordinator's host)
    dashboard: str | None = None  # [HOST:]PORT of the run's live page (server/dashboard/)
    dashboard_state: Path | None = None  # the page's state kept in this file (server/dashboard/feed.py)

    @property
    def strategy(self) -> str:
        return self.learning.strategy

    @property
    def rounds(self) -> int:
        return self.learning.rounds


@dataclass(frozen=True)
class PreparedServe:
    options: ServeOptions
    train: TrainConfig
    params: dict[str, Any]
    settings: dict[str, Setting]
    strategy: Strategy  # built once, checked, and the one the run uses


def prepare_serve(opts: ServeOptions) -> PreparedServe:
    """Check every setting before anything connects or is written; the coordinator's
    copies of the learning settings are set from ``opts.learning`` here."""
    run = opts.learning
    opts.coordinator = c = replace(
        opts.coordinator,
        seed=run.seed,
        codec=run.codec,  # type: ignore[arg-type]  # checked by RunConfig
        federated_eval_every=run.federated_eval_every,
        screening=run.screening_config(),
    )
    for name, value, low in (
        ("--min-devices", opts.min_devices, 1),
        ("--max-devices", c.max_devices, 1),
        ("--round-attempts", c.round_attempts, 1),
        ("--links-every", c.links_every, 0),
    ):
        if value < low:
            raise ConfigError(f"{name} must be at least {low}, got {value}")
    if c.deadline_s <= 0 or opts.register_timeout <= 0:
        raise ConfigError("--deadline and --register-timeout must be positive numbers of seconds")
    resolved = resolve_run(run)
    strategy = resolved.strategy
    if opts.min_devices < strategy.min_clients():
        raise ConfigError(
            f"{run.strategy} needs {strategy.min_clients()} devices (e.g. clients per round) but --min-devices is "
            f"{opts.min_devices}: raise --min-devices or lower the strategy's setting (covey strategies lists them)"
        )
    if not 0 < c.link_bandwidth_hz < float("inf"):
        raise ConfigError(f"--link-bandwidth-mhz must be a positive number, got {c.link_bandwidth_hz / 1e6:g}")
    if c.max_devices < opts.min_devices:
        raise ConfigError(f"--max-devices {c.max_devices} admits fewer than --min-devices {opts.min_devices}")
    if c.allowed_devices is not None and len(c.allowed_devices) < opts.min_devices:
        raise ConfigError(
            f"only {len(c.allowed_devices)} devices may register (the site's, or --allow-devices) but "
            f"--min-devices is {opts.min_devices}: add devices (`covey site add-device`) or lower --min-devices"
        )
    if opts.eval_dir is not None and not opts.eval_dir.exists():
        raise ConfigError(f"--eval-data {opts.eval_dir} does not exist")
    if opts.dashboard is not None:
        from server.dashboard.live import parse_address

        parse_address(opts.dashboard)  # a bad address is one line before anything starts
    if opts.dashboard_state is not None and opts.dashboard_state.is_dir():
        raise ConfigError(f"--dashboard-state {opts.dashboard_state} is a folder; name a file to write")
    settings = {
        **run.learning_settings(),
        "model": run.setting("model", opts.model_path.stem),
        "run": Setting(c.run, Source.FLAG, "--run or the site's"),
        "handoff": Setting(c.handoff, Source.FLAG, "--handoff"),
        "deadline_s": Setting(c.deadline_s, Source.FLAG, "--deadline"),
        "allowed_devices": Setting(
            sorted(c.allowed_devices) if c.allowed_devices is not None else "any",
            Source.FLAG if c.allowed_devices is not None else Source.DEFAULT,
            "--allow-devices or the site's devices",
        ),
        "max_devices": Setting(c.max_devices, Source.FLAG, "--max-devices"),
        "round_attempts": Setting(c.round_attempts, Source.FLAG, "--round-attempts"),
        "links_every": Setting(c.links_every, Source.FLAG, "--links-every"),
        "link_bandwidth_hz": Setting(c.link_bandwidth_hz, Source.FLAG, "--link-bandwidth-mhz"),
        **resolved.settings,
    }
    return PreparedServe(opts, resolved.train, resolved.params, settings, strategy)


def leaf_eval_set(root: Path) -> Dataset:
    """The server's held-out set: every writer's test split of a LEAF folder."""
    folder = root / "test" if (root / "test").is_dir() else root
    test = read_leaf(folder)
    if not test:
        raise ConfigError(f"{folder} holds no users")
    return Dataset(np.concatenate([d.x for d in test.values()]), np.concatenate([d.y for d in test.values()]))


def serve(opts: ServeOptions | PreparedServe, *, progress: bool = True) -> Coordinator:
    prepared = opts if isinstance(opts, PreparedServe) else prepare_serve(opts)
    o = prepared.options
    c = o.coordinator
    eval_data = leaf_eval_set(o.eval_dir) if o.eval_dir else None
    coord = Coordinator(
        c,
        prepared.strategy,
        o.model_path,
        eval_data,
    )
    zc = None
    dashboard = feed = None
    try:
        if o.dashboard is not None or o.dashboard_state is not None:
            from server.dashboard.feed import DashboardFeed, StateFile, StateView, Views
            from server.dashboard.live import DashboardServer, LiveView, parse_address

            views: list[StateView] = []
            if o.dashboard is not None:
                view = LiveView()
                title = f"covey: {o.strategy} on {c.run}"
                dashboard = DashboardServer(view, parse_address(o.dashboard), title).start()
                views.append(view)
            if o.dashboard_state is not None:
                views.append(StateFile(o.dashboard_state))
            feed = DashboardFeed(Views(*views), coord.registry.fleet_entries, progress=coord.execution.progress)
            feed.publish()
            coord.on_pump = feed.tick
            if dashboard is not None:
                print(f"dashboard: {dashboard.url}", flush=True)
                keep_url(c.state_dir / "dashboard-url", dashboard.url)  # where to find the page later
        coord.connect()
        if o.advertise:
            from device.discovery import advertise

            zc = advertise(c.run, o.advertise_host or c.host, c.port)
        resumed = o.resume and coord.resume()
        from tqdm import tqdm

        with tqdm(total=o.min_devices, desc="devices registered", unit="device", disable=not progress) as bar:

            def registered(n: int) -> None:
                bar.n = n
                bar.refresh()

            coord.wait_for_devices(o.min_devices, o.register_timeout, progress=registered)
        fleet = coord.registry.fleet_summary()
        log.info("fleet: %s", fleet)
        if progress:
            print(fleet, flush=True)
        if progress:  # on a slow site this takes a while before round 1
            print(
                f"measuring the links of {len(coord.backend.ready_devices())} devices (docs/links.md) ...", flush=True
            )
        if feed is not None:
            feed.set_status("measuring links")
        links = coord.measure_links()
        if progress:
            print(f"links: SNR entries {links.counts('snr')}, RTT entries {links.counts('rtt')}", flush=True)
        if not resumed:
            coord.setup_strategy()
        coord.driver.last_round = o.rounds
        title = f"{o.strategy} over MQTT ({c.run})"

        def record(plot: bool) -> None:
            """results.json (and with ``plot`` its PNG) as the run stands; the page gets
            the same document."""
            document = run_document(
                records=coord.records,
                settings=prepared.settings,
                links=coord.backend.links_record(),
                devices=coord.registry.boards_record(),
                run_events=coord.run_events,
            )
            write_run(
                c.state_dir,
                RESULTS_STEM,
                records=coord.records,
                settings=prepared.settings,
                title=title,
                plot=plot,
                document=document,
            )
            if feed is not None:
                feed.set_results(document)

        with tqdm(
            total=o.rounds, initial=coord.driver.rnd, desc=f"{o.strategy} rounds", unit="round", disable=not progress
        ) as bar:
            while coord.driver.rnd < o.rounds:
                if feed is not None:
                    feed.set_status("running", coord.driver.rnd + 1)
                rec = coord.step()
                record(plot=False)
                bar.update(1)
                shown = rec.server_accuracy if np.isfinite(rec.server_accuracy) else rec.federated_accuracy
                bar.set_postfix(acc=f"{shown:.3f}", trained=rec.trained, skipped=rec.skipped)
        record(plot=True)
        if feed is not None:
            feed.set_status("finished")
        coord.stop_devices()  # close() waits for the broker to take the status after these
        return coord
    finally:
        if zc is not None:
            zc.close()
        if dashboard is not None:
            dashboard.close()
        coord.close()
