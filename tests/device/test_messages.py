"""Typed message bodies: every one round-trips, validates, and matches the published schema."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from device.errors import ProtocolError
from device.protocol import (
    SERVER_ID,
    Ack,
    Assignment,
    DeviceHop,
    EvalRow,
    EvaluateRequest,
    EvaluateResult,
    FrameExtra,
    LinkProbeRequest,
    LinkReport,
    Listen,
    LocalTraining,
    ManagerHop,
    Message,
    PathReport,
    Ping,
    Pong,
    PretrainRequest,
    PretrainResult,
    Register,
    ResendRequest,
    ServerStatus,
    Stop,
    TrainFailed,
    TrainRequest,
    TrainResult,
    WifiInfo,
    decode_message,
    encode_frames,
)
from device.protocol.schema import render

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "protocol.schema.json"

EXAMPLES = [
    Register(10, 2, (4, 6), "ai_edge_litert", 512, True, "ab" * 32),
    TrainResult("t1", 10, 0.5, 2, 0, 1, (4, 6), 1.5, 0.1),
    PretrainResult("t2", 10, 0.7, 50),
    EvaluateResult("t3", (EvalRow(0, 0.3, 7, 9), EvalRow(1, 0.4, 6, 9))),
    Pong(1.5),
    TrainRequest("t1", 0, 1, "chain", "dev000", DeviceHop("dev002", "t9"), LocalTraining(1, 5, 0.01), 3),
    TrainRequest("t1", 2, 0, "parallel", SERVER_ID, ManagerHop(2), LocalTraining(10, 10, 0.01, 1.0, 7), 0, ("k1",)),
    PretrainRequest("t2", 50, 10, 0.01, 0, ("k1",)),
    EvaluateRequest("t3", 2, "test"),
    ResendRequest("t1", ManagerHop(0)),
    Ping(1.0),
    Stop("the run is over"),
    Assignment(-1),
    ServerStatus("e1f2", "running", model_sha256="cd" * 32),
    Ack(("t1", "t2")),
    LinkProbeRequest("lp1", ("dev001", "dev002"), 3, 262_144, 5.0),
    LinkReport(
        "lp1",
        (PathReport("server", 4, 4, 2.5, 0.3, 4.2e7), PathReport("dev002", 4, 0)),
        WifiInfo("wlan0", "/proc/net/wireless", -61.0, -92.0),
    ),
    Listen(("peer-a", "peer-b"), 30.0),
    TrainFailed("t7", "diverged", "weights became NaN"),
]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))


def test_the_published_schema_is_the_one_the_code_generates() -> None:
    assert SCHEMA_FILE.read_text() == render(), "run: python -m device.protocol.schema docs/protocol.schema.json"


def test_every_message_type_has_an_example() -> None:
    from device.protocol import MESSAGE_TYPES

    assert {Message.of(b, run="r", sender="x").type for b in EXAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("body", EXAMPLES, ids=lambda b: type(b).__name__)
def test_each_body_round_trips_and_validates_against_the_schema(body, validator) -> None:
    # Prepare
    sender = SERVER_ID if isinstance(body, (TrainRequest, Ping, Stop, ServerStatus)) else "dev001"
    data = Message.of(body, run="site", sender=sender, round=3).encode()

    # Execute
    back = decode_message(data)

    # Assert
    assert back.body == body
    validator.validate(json.loads(data))


@pytest.mark.parametrize(
    ("body", "change", "message"),
    [
        (EXAMPLES[0], {"class_counts": [4, 5]}, "sum to 9, but n_samples is 10"),
        (EXAMPLES[0], {"n_samples": "10"}, "register.body.n_samples must be an integer"),
        (EXAMPLES[0], {"class_counts": "4,6"}, "register.body.class_counts must be a list"),
        (EXAMPLES[0], {"class_counts": [[4], [6]]}, r"class_counts\[0\] must be an integer"),
        (EXAMPLES[1], {"loss": "0.5"}, "result.body.loss must be a finite number"),
        (EXAMPLES[1], {"kind": "other"}, "result.body.kind must be one of"),
        (EXAMPLES[3], {"evaluations": [{"index": "0", "loss": 1, "correct": 1, "n": 1}]}, "index must be an integer"),
        (EXAMPLES[8], {"split": "validation"}, "split must be one of"),
        (EXAMPLES[8], {"n_models": 2, "shared": ["k1"]}, "1 shared keys for 2 models"),
        (EXAMPLES[15], {"probes": 17}, "probes must be at most 16"),
        (EXAMPLES[-2], {"seconds": 4000}, "seconds must be at most 3600"),
        (EXAMPLES[-2], {"seconds": 0}, "seconds must be"),
        (EXAMPLES[-1], {"reason": "bored"}, "reason must be one of"),
        (EXAMPLES[-1], {"detail": "x" * 301}, "detail"),
        (EXAMPLES[15], {"peers": "dev001"}, "peers must be a list"),
        (EXAMPLES[16], {"paths": [{"target": "server", "sent": 2, "answered": 3}]}, "3 of 2 probes answered"),
        (EXAMPLES[16], {"paths": [{"target": "server", "sent": 1, "answered": 1, "rtt_ms": -4}]}, "not between 0"),
        (EXAMPLES[16], {"paths": [{"target": "a/b", "sent": 1, "answered": 1}]}, "probe target"),
        (EXAMPLES[16], {"wifi": {"interface": "wlan0", "source": "iw", "signal_dbm": 400}}, "not a level"),
    ],
)
def test_a_bad_body_is_refused_by_the_code_and_by_the_schema(body, change, message, validator) -> None:
    raw = json.loads(Message.of(body, run="site", sender="dev001").encode())
    raw["body"].update(change)
    with pytest.raises(ProtocolError, match=message):
        decode_message(json.dumps(raw).encode())
    code_only = ("sum to", "shared keys", "at most", "probes answered", "not between", "not a level")
    if not any(
        rule in message for rule in code_only
    ):  # cross-field and range rules are the code's alone  # cross-field rules are the code's alone
        assert not validator.is_valid(raw)


def test_nan_never_travels_as_json() -> None:
    with pytest.raises(ProtocolError, match="non-finite"):
        Message.of(Pong(float("nan")), run="r", sender="d").encode()


def test_frame_headers_validate_against_the_schema(validator) -> None:
    header_schema = {"$ref": "#/$defs/FrameHeader", "$defs": validator.schema["$defs"]}
    check = jsonschema.Draft202012Validator(header_schema)
    for kind, extra in (("model", FrameExtra("t1", index=1)), ("handoff", FrameExtra("t2", position=0))):
        frame = next(
            encode_frames(np.zeros(3, np.float32), kind=kind, run="r", round=1, group=-1, sender="s", extra=extra)
        )
        (n,) = struct.unpack("<I", frame[4:8])
        check.validate(json.loads(frame[8 : 8 + n]))


def test_readers_built_ahead_behave_as_reading_each_value_did() -> None:
    """Readers are built once per type (device/protocol/typed.py). Equal types that
    list their values in another order keep their own order in errors; an Annotated
    type with unhashable metadata is still read; a field of a type no reader supports
    fails only when it is present, naming the field."""
    from dataclasses import dataclass
    from typing import Annotated, Literal

    from device.protocol.typed import from_body, read_value

    with pytest.raises(ProtocolError, match=r"one of \['a', 'b'\]"):
        read_value(Literal["a", "b"], "c", "x")
    with pytest.raises(ProtocolError, match=r"one of \['b', 'a'\]"):
        read_value(Literal["b", "a"], "c", "x")
    assert read_value(Annotated[int, {"unhashable": True}], 3, "x") == 3

    @dataclass(frozen=True)
    class WithUnsupported:
        n: int
        extra: list[int] | None = None  # no reader supports a list type

    assert from_body(WithUnsupported, {"n": 1}) == WithUnsupported(1)
    with pytest.raises(TypeError, match=r"WithUnsupported\.extra"):
        from_body(WithUnsupported, {"n": 1, "extra": [1]})
