"""Fuzzing every decoder of untrusted input: only covey's own errors may escape.

A small run of ``bench/fuzz.py`` (a few thousand generated and mutated inputs), and
the inputs the first full run found crashing, each refused with a CoveyError now.
"""

from __future__ import annotations

import json
import struct

import pytest

from device.errors import CoveyError
from device.protocol import MAGIC, Message, Pong, TrainResult
from server.lab.fuzzing import all_targets, run_fuzz
from server.lab.fuzzing.targets import N_PARAMS, pack_frame, split_frame


def _frame_header(**change: object) -> bytes:
    from server.lab.fuzzing.targets import _frame_target

    seed = _frame_target().seeds[0]
    parts = split_frame(seed)
    assert parts is not None
    header, chunk = parts
    header.update(change)
    return pack_frame(header, chunk)


def _message(body: object, **change: object) -> bytes:
    raw = json.loads(Message.of(body, run="site", sender="dev001").encode())
    raw["body"].update(change)
    return json.dumps(raw).encode()


def _manifest(**change: object) -> bytes:
    from server.lab.fuzzing.targets import manifest_templates

    return json.dumps({**manifest_templates()[1], **change}).encode()


PONG_HEAD = b'{"v":2,"type":"pong","run":"r","sender":"d","round":0,"id":"i","sent_at":1,"body":{"echo":'
SIGNATURES = ["evaluate", "get_weights", "infer", "set_weights", "train", "train_deferred", "flush"]
RESULT = TrainResult("t1", 10, 0.5, 2, 0, 1, (4, 6))
# (target, input): each crashed a decoder with something other than a CoveyError
CRASHERS = [
    ("frame", MAGIC + struct.pack("<I", 4000) + b"[" * 2000 + b"]" * 2000),  # RecursionError
    ("frame", _frame_header(nbytes=10**400)),  # OverflowError in the chunk arithmetic
    ("message", PONG_HEAD + b"1" + b"0" * 400 + b"}}"),  # a float field holding a 401-digit integer
    ("message", PONG_HEAD + b"1" * 5000 + b"}}"),  # ValueError: more than 4300 digits
    ("message", _message(RESULT, kind=["train"])),  # unhashable union tag
    ("message", _message(Pong(1.0), echo=-(10**400))),
    ("manifest", _manifest(signatures=[*SIGNATURES, ["flush"]])),  # unhashable signature
    ("manifest", _manifest(signatures=[*SIGNATURES, {"a": 1}])),
    ("manifest", b'{"format": ' + b"1" * 5000 + b"}"),  # ValueError: more than 4300 digits
    ("device_config", b"broker = " + b"[" * 3000 + b"]" * 3000),  # RecursionError in tomllib
    ("device_config", b"threads = " + b"1" * 5000),  # ValueError: more than 4300 digits
    ("simulation_config", b"UC\xf2\xa9"),  # not UTF-8
    ("simulation_config", b"simulation = 'abc'\n"),  # a section that is not a table
    ("simulation_config", b"dataset = [1, 2, [3]]\n"),
    ("simulation_config", b"[strategy]\nname = []\n"),  # an unhashable strategy name
    ("simulation_config", b"x = " + b"[" * 3000 + b"]" * 3000),
    ("simulation_config", b"[simulation]\nmodel = 3\n"),
    ("simulation_config", b'[dataset]\nname = "synthetic"\nalpha = []\n'),  # breaks the data set later
]


@pytest.mark.parametrize(("target", "data"), CRASHERS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CRASHERS)])
def test_an_input_that_crashed_a_decoder_is_refused_with_a_covey_error(target: str, data: bytes) -> None:
    # Prepare
    decoder = next(t for t in all_targets() if t.name == target)

    # Execute / Assert
    with pytest.raises(CoveyError):
        decoder.decode(data)


def test_every_seed_input_decodes() -> None:
    # a fuzzer whose seeds are refused tests nothing but the first check
    for target in all_targets():
        for data in target.seeds:
            target.decode(data)


@pytest.mark.slow
def test_decoders_survive_thousands_of_generated_and_mutated_inputs() -> None:
    # Execute
    report = run_fuzz(3000, random_state=7, generated_fraction=0.1)

    # Assert
    assert report.total_inputs >= 3000
    assert set(report.inputs) == {"frame", "message", "manifest", "device_config", "simulation_config"}
    assert not report.crashes, "\n".join(c.describe() for c in report.crashes[:5])
    assert N_PARAMS == 8
