"""The flags of a run's learning settings, the same for ``covey simulate``, ``covey
compare`` and ``covey server run``, and the one path that turns them into a
:class:`~server.run_config.RunConfig`: a preset, then a config file, then flags (later
sources win, each remembered in ``origins``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.simulation.config import SimulationConfig

FLAG_DETAIL = "command line"


def add_learning_flags(p: argparse.ArgumentParser, *, model_help: str, who: str = "client") -> None:
    """``--preset``, ``--config``, the model, rounds, training, strategy parameters,
    screening, codec and federated evaluation; every default is ``None`` so that a
    preset or a file is overridden only by what the user typed."""
    p.add_argument("--preset", help="a paper's setting (see `covey presets`); a config file and flags override it")
    p.add_argument("--config", help="TOML settings file, as `covey simulate --config` takes (flags override it)")
    p.add_argument("--model", help=model_help)
    p.add_argument("--rounds", type=int, help="communication rounds (default 50)")
    p.add_argument(
        "--clients-per-round",
        type=int,
        help=f"{who}s sampled per round, for the strategies that sample them (FedGSP samples groups: κ)",
    )
    p.add_argument("--epochs", type=int, help=f"local epochs per {who} and round (default: the method's paper value)")
    p.add_argument("--batch", type=int, help="local mini-batch size (default: the method's paper value)")
    p.add_argument("--lr", type=float, help="local SGD learning rate (default: the method's paper value)")
    p.add_argument("--mu", type=float, help="FedProx proximal weight for local training (default: the method's)")
    p.add_argument(
        "--lr-decay",
        type=float,
        metavar="D",
        help="the learning rate of round r is lr x D^(r-1), in (0, 1] (default: the method's paper value, "
        "1 for most: no decay)",
    )
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="strategy parameter, e.g. n_groups=5 kappa=0.3 mu=0.01"
    )
    add_screening_flags(p)
    add_codec_flag(p)
    p.add_argument(
        "--federated-eval-every",
        type=int,
        metavar="N",
        help=f"every N rounds (and after the last) each {who} scores the model it would use on its own "
        'test set (default 1; 0: never; what it costs a round: docs/results.md, "Simulation speed")',
    )


def add_codec_flag(p: argparse.ArgumentParser) -> None:
    """How models travel: the same flag for ``covey simulate`` and ``covey server run``."""
    from device.protocol import WIRE_CODECS

    p.add_argument(
        "--codec",
        choices=WIRE_CODECS,
        help="model payloads on the wire: fp32 (default), fp16, or int8 / int4 deltas with error "
        "feedback (start models as deltas against the model a device holds, else as q8, 8-bit "
        "blocks, to devices that list it and fp16 to others; chain hand-offs relayed as deltas; "
        "int4 nearly halves int8's bytes where deltas are dense, as on the CNN; docs/protocol.md)",
    )


def add_screening_flags(p: argparse.ArgumentParser) -> None:
    """What the round driver refuses and how it averages (:mod:`server.screening`)."""
    p.add_argument(
        "--screening",
        choices=("on", "off"),
        help="refuse updates whose norm exceeds --norm-factor times the round's median (default: on)",
    )
    p.add_argument("--norm-factor", type=float, help="the update-norm bound, times the round's median (default 10)")
    p.add_argument(
        "--aggregation",
        choices=("mean", "median", "trimmed_mean"),
        help="how FedAvg-style strategies average: the sample-weighted mean (default), or the coordinate-wise "
        "median or trimmed mean of Yin et al. 2018",
    )
    p.add_argument("--trim", type=float, help="the trimmed mean's fraction cut at each end, in [0, 0.5) (default 0.2)")


def learning_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What the user typed of the learning flags, as :class:`RunConfig` changes
    (``None``: not typed, so a preset's or a file's value stands)."""
    from server.simulation.config import parse_assignments

    return {
        "model": args.model,
        "rounds": args.rounds,
        "seed": getattr(args, "seed", None),
        "epochs": args.epochs,
        "batch": args.batch,
        "lr": args.lr,
        "mu": args.mu,
        "lr_decay": args.lr_decay,
        "strategy_params": parse_assignments(args.set) or None,
        "clients_per_round": args.clients_per_round,
        "screening": {"on": True, "off": False}.get(args.screening or ""),
        "norm_factor": args.norm_factor,
        "aggregation": args.aggregation,
        "trim": args.trim,
        "codec": args.codec,
        "federated_eval_every": args.federated_eval_every,
    }


def from_preset_and_file(args: argparse.Namespace, base: SimulationConfig, strategy: str | None) -> SimulationConfig:
    """``base`` under ``--preset`` (for ``strategy``, default the preset's method), then
    under ``--config``."""
    from server.simulation.config import load_config
    from server.simulation.presets import preset

    cfg = base
    if args.preset:
        cfg = preset(args.preset).apply(cfg, strategy)
    if args.config:
        cfg = load_config(args.config, cfg)
    return cfg
