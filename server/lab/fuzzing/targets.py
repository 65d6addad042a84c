"""The decoders under test, their valid seed inputs, and structure-aware mutators.

Each :class:`Target` decodes one kind of untrusted input the way covey does:

* ``frame``: :func:`~device.protocol.parse_frame`, then one long-lived
  :class:`~device.protocol.Reassembler` (so chunks of earlier inputs meet later ones),
  :func:`~device.protocol.check_weights` on a completed payload, and the artifact
  download for ``artifact`` frames;
* ``message``: :func:`~device.protocol.decode_message`, every message type;
* ``manifest``: what a device does with a retained ``artifact/manifest`` (JSON, then
  :func:`~device.manifest.parse_manifest`);
* ``device_config``: ``covey-device --config FILE`` up to the checked settings;
* ``simulation_config``: ``covey simulate --config FILE`` up to the prepared run
  (:func:`~server.simulation.config.load_config`, then
  :func:`~server.simulation.run.prepare`, which builds the strategy).

Anything but covey's own :class:`~device.errors.CoveyError` escaping ``decode`` is a
crash.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device.protocol import (
    MAGIC,
    SERVER_ID,
    Ack,
    Assignment,
    DeviceHop,
    ErrorFeedback,
    EvalRow,
    EvaluateRequest,
    EvaluateResult,
    FrameExtra,
    LocalTraining,
    ManagerHop,
    Message,
    Ping,
    Pong,
    PretrainRequest,
    PretrainResult,
    Reassembler,
    Register,
    ResendRequest,
    ServerStatus,
    Stop,
    TrainRequest,
    TrainResult,
    check_weights,
    decode_message,
    encode_float,
    encode_frames,
    parse_frame,
    payload_key,
)
from server.lab.fuzzing.mutate import dumps_json, dumps_toml, mutate_tree

N_PARAMS = 8  # the fuzzed frames' "model" size
REPO = Path(__file__).resolve().parents[2]
StructuredMutator = Callable[[bytes, np.random.Generator], bytes]


@dataclass
class Target:
    """One decoder: ``decode`` raises :class:`CoveyError` for input it refuses."""

    name: str
    decode: Callable[[bytes], object]
    seeds: list[bytes]
    templates: list[Any]  # parsed seeds (JSON/TOML trees) for generation
    structured: StructuredMutator
    encode_tree: Callable[[Any], bytes]
    state: dict[str, Any] = field(default_factory=dict)


# -- control messages ---------------------------------------------------------------------------
def message_bodies() -> list[object]:
    """One body of every message type (and every result kind)."""
    return [
        Register(10, 2, (4, 6), "ai_edge_litert", 512, True, "ab" * 32),
        TrainResult("t1", 10, 0.5, 2, 0, 1, (4, 6), 1.5, 0.1),
        PretrainResult("t2", 10, 0.7, 50),
        EvaluateResult("t3", (EvalRow(0, 0.3, 7, 9), EvalRow(1, 0.4, 6, 9))),
        Pong(1.5),
        TrainRequest("t1", 0, 1, "chain", "dev000", DeviceHop("dev002", "t9"), LocalTraining(1, 5, 0.01), 3),
        TrainRequest("t1", 2, 0, "parallel", SERVER_ID, ManagerHop(2), LocalTraining(10, 10, 0.01, 1.0, 7), 0, ("k",)),
        PretrainRequest("t2", 50, 10, 0.01, 0, ("k1",)),
        EvaluateRequest("t3", 2, "test", ("k1", "k2")),
        ResendRequest("t1", ManagerHop(0)),
        Ping(1.0),
        Stop("the run is over"),
        Assignment(-1),
        ServerStatus("e1f2", "running", model_sha256="cd" * 32),
        Ack(("t1", "t2")),
    ]


def _message_target() -> Target:
    seeds = [Message.of(b, run="site", sender="dev001", round=3).encode() for b in message_bodies()]
    templates = [json.loads(s) for s in seeds]

    def structured(data: bytes, rng: np.random.Generator) -> bytes:
        try:
            tree = json.loads(data)
        except (ValueError, RecursionError):
            tree = templates[int(rng.integers(len(templates)))]
        return dumps_json(mutate_tree(tree, rng, int(rng.integers(1, 4))))

    return Target("message", decode_message, seeds, templates, structured, dumps_json)


# -- frames -------------------------------------------------------------------------------------
def _frames(
    array: np.ndarray,
    kind: str,
    extra: FrameExtra,
    max_chunk: int,
    sender: str = "dev001",
    codec: str = "raw",
    base: str | None = None,
) -> list[bytes]:
    return list(
        encode_frames(
            array,
            kind=kind,  # type: ignore[arg-type]
            run="site",
            round=3,
            group=1,
            sender=sender,
            max_chunk=max_chunk,
            extra=extra,
            codec=codec,  # type: ignore[arg-type]
            base=base,
        )
    )


def _delta_frames(weights: np.ndarray, start: np.ndarray, key: str) -> list[bytes]:
    """A device's output against the start model ``key`` as ``int8`` and ``int4`` deltas.
    (Their deflated forms are never smaller at this model size, so a receiver refuses
    them before inflating; mutating ``codec`` reaches that check.)"""
    out = []
    for bits, codec in ((8, "int8"), (4, "int4")):
        payload = ErrorFeedback().encode(weights, start, bits)  # type: ignore[arg-type]
        out += _frames(payload, "result", FrameExtra(f"t{bits}", position=0), 1 << 20, codec=codec, base=key)
    return out


def split_frame(frame: bytes) -> tuple[Any, bytes] | None:
    """``(header JSON tree, chunk)`` of a well-formed frame layout, else None."""
    if len(frame) < 8 or frame[:4] != MAGIC:
        return None
    (n,) = struct.unpack("<I", frame[4:8])
    try:
        return json.loads(frame[8 : 8 + n]), frame[8 + n :]
    except (ValueError, RecursionError):
        return None


def pack_frame(header: Any, chunk: bytes) -> bytes:
    head = dumps_json(header)
    return MAGIC + struct.pack("<I", len(head)) + head + chunk


def _frame_target() -> Target:
    weights = np.arange(N_PARAMS, dtype=np.float32)
    start = weights * 0.5  # the model delta frames are against, which the receiver holds
    key = payload_key(start)
    seeds = [
        *_delta_frames(weights, start, key),
        *_frames(weights, "result", FrameExtra("t1", position=0), 1 << 20),
        *_frames(weights, "handoff", FrameExtra("t2", position=1), 12),  # three chunks
        *_frames(weights, "update", FrameExtra("t3"), 1 << 20),
        *_frames(weights, "model", FrameExtra("t4", index=1), 16, SERVER_ID),
        *_frames(weights, "model", FrameExtra(shared="k1"), 1 << 20, SERVER_ID),
        *_frames(encode_float(weights, "q8"), "model", FrameExtra("t5"), 1 << 20, SERVER_ID, codec="q8"),
        *_frames(np.arange(40, dtype=np.uint8), "artifact", FrameExtra(), 16, SERVER_ID),
    ]
    templates = [split_frame(s)[0] for s in seeds]  # type: ignore[index]
    state: dict[str, Any] = {}

    def decode(data: bytes) -> object:
        from device.artifact import ArtifactDownload

        header, _ = parse_frame(data)
        if header.kind == "artifact":
            download = state.setdefault("artifact", ArtifactDownload())
            download.add_chunk(data)
            return download.complete()
        # small bounds, so eviction and expiry are exercised too
        frames = state.setdefault("frames", Reassembler(max_bytes=1 << 16, max_pending_bytes=1 << 12))
        payload = frames.add(data)
        return None if payload is None else check_weights(payload, N_PARAMS, {key: start})

    def structured(data: bytes, rng: np.random.Generator) -> bytes:
        parts = split_frame(data)
        if parts is None:
            parts = split_frame(seeds[int(rng.integers(len(seeds)))])
        assert parts is not None
        header, chunk = parts
        if rng.integers(4):
            header = mutate_tree(header, rng, int(rng.integers(1, 3)))
        choice = int(rng.integers(5))
        if choice == 0:  # a chunk longer than announced (the 4-byte/100 KB probe)
            chunk = chunk + bytes(int(rng.choice((1, 4, 100_000))))
        elif choice == 1:
            chunk = chunk[: int(rng.integers(len(chunk) + 1))]
        return pack_frame(header, chunk)

    return Target("frame", decode, seeds, templates, structured, lambda tree: pack_frame(tree, bytes(32)), state)


# -- manifests ----------------------------------------------------------------------------------
def manifest_templates() -> list[dict[str, Any]]:
    signatures = ["evaluate", "get_weights", "infer", "set_weights", "train"]
    base: dict[str, Any] = {
        "format": 1,
        "model": "tiny",
        "description": "a fuzzing seed",
        "input_shape": [4],
        "input_dtype": "float32",
        "label_dtype": "int32",
        "n_classes": 2,
        "n_params": 10,
        "tensors": [{"name": "w", "shape": [2, 4], "offset": 0}, {"name": "b", "shape": [2], "offset": 8}],
        "signatures": signatures,
        "deferred_rank": 0,
        "accumulate_chunk": 0,
        "covey_version": "0.1.0",
        "sha256": "ab" * 32,
        "initial_weights": False,
    }
    deferred = {**base, "deferred_rank": 2, "signatures": [*signatures, "train_deferred", "flush"]}
    accumulate = {
        **base,
        "accumulate_chunk": 4,
        "signatures": [*signatures, "accumulate", "apply_accumulated", "apply_accumulated_prox"],
    }
    return [base, deferred, accumulate]


def _manifest_target() -> Target:
    templates = manifest_templates()
    seeds = [dumps_json(t) for t in templates]

    def decode(data: bytes) -> object:
        from device.artifact import ArtifactDownload

        download = ArtifactDownload()
        download.add_manifest(data)
        return download.manifest

    def structured(data: bytes, rng: np.random.Generator) -> bytes:
        try:
            tree = json.loads(data)
        except (ValueError, RecursionError):
            tree = templates[int(rng.integers(len(templates)))]
        return dumps_json(mutate_tree(tree, rng, int(rng.integers(1, 4))))

    return Target("manifest", decode, seeds, list(templates), structured, dumps_json)


# -- configuration files --------------------------------------------------------------------------
def _toml_structured(templates: list[Any]) -> StructuredMutator:
    from server.lab.fuzzing.mutate import dumps_toml

    def structured(data: bytes, rng: np.random.Generator) -> bytes:
        import tomllib

        try:
            tree = tomllib.loads(data.decode())
        except (ValueError, RecursionError):  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
            tree = templates[int(rng.integers(len(templates)))]
        return dumps_toml(mutate_tree(tree, rng, int(rng.integers(1, 4))))

    return structured


def device_config_templates() -> list[dict[str, Any]]:
    full = {
        "broker": "192.168.1.10:8883",
        "run": "site",
        "id": "pi-kitchen",
        "data": "/var/lib/covey/train.npz",
        "user": "f0001",
        "test": "/var/lib/covey/test.npz",
        "state_dir": "/var/lib/covey/state",
        "username": "pi-kitchen",
        "password": "secret",
        "ca_certs": "/etc/covey/ca.crt",
        "certfile": "/etc/covey/pi.crt",
        "keyfile": "/etc/covey/pi.key",
        "threads": 2,
        "idle_timeout": 30.5,
        "train_priority": "idle",
    }
    return [full, {"broker": "localhost:1883", "run": "demo", "data": "train.json"}]


def _config_file(state: dict[str, Any], name: str, data: bytes) -> Path:
    if "dir" not in state:
        state["dir"] = tempfile.TemporaryDirectory(prefix="covey-fuzz-")
    path = Path(state["dir"].name) / name
    path.write_bytes(data)
    return path


def _device_config_target() -> Target:
    templates = device_config_templates()
    state: dict[str, Any] = {}

    def decode(data: bytes) -> object:
        from device.cli import _settings, build_parser

        path = _config_file(state, "device.toml", data)
        return _settings(build_parser().parse_args(["--config", str(path)]))

    seeds = [dumps_toml(t) for t in templates]
    return Target("device_config", decode, seeds, list(templates), _toml_structured(templates), dumps_toml, state)


def simulation_config_templates() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    import tomllib

    for path in sorted((REPO / "examples").glob("*.toml")):
        out.append(tomllib.loads(path.read_text()))
    out.append(
        {
            "simulation": {"rounds": 5, "seed": 1, "workers": 1, "shift_probability": 0.1, "clients_per_round": 4},
            "dataset": {"name": "mnist", "clients": 20, "scheme": "dirichlet", "dirichlet_alpha": 0.5},
            "train": {"epochs": 1, "batch": 10, "lr": 0.05, "mu": 0.0},
            "strategy": {"name": "fedgsp", "beta": 3, "kappa": 0.5, "growth": "linear"},
            "screening": {"enabled": True, "norm_factor": 10.0, "aggregation": "trimmed_mean", "trim": 0.2},
        }
    )
    return out


def _simulation_config_target() -> Target:
    templates = simulation_config_templates()
    state: dict[str, Any] = {}

    def decode(data: bytes) -> object:
        from server.simulation.config import load_config
        from server.simulation.run import prepare

        path = _config_file(state, "simulation.toml", data)
        return prepare(load_config(path))

    seeds = [dumps_toml(t) for t in templates]
    return Target("simulation_config", decode, seeds, templates, _toml_structured(templates), dumps_toml, state)


def all_targets() -> list[Target]:
    """Every decoder of untrusted input, each with fresh state."""
    return [
        _frame_target(),
        _message_target(),
        _manifest_target(),
        _device_config_target(),
        _simulation_config_target(),
    ]
