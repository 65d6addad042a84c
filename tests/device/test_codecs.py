"""Wire codecs: round trips within the stated bounds, error feedback, chains of
hand-offs, and frames with unknown or corrupt codec fields refused with a reason."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from device.errors import ProtocolError
from device.protocol import (
    ErrorFeedback,
    FrameExtra,
    Reassembler,
    check_weights,
    decode,
    encode_float,
    encode_frames,
    encode_output,
    parse_frame,
    payload_key,
)
from device.protocol.codecs import BLOCK, Bits, delta_length, dequantise, int8_length, pack, quantise, unpack
from tests.device.test_protocol import _rebuild


def _weights(n: int = 5_000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, n).astype(np.float32)


def _int8_bound(delta: np.ndarray, bits: Bits = 8) -> np.ndarray:
    """Per value: half a step of its block plus float32 rounding (codecs docstring; a
    step is the block's range over 255 levels for int8, 15 for int4)."""
    n = delta.size
    pad = np.concatenate([delta, np.full(-n % BLOCK, delta[-1])]).reshape(-1, BLOCK)
    step = (pad.max(1) - pad.min(1)) / ((1 << bits) - 1)
    big = np.abs(pad).max(1)
    return np.repeat(step / 2 + 2.0**-22 * big, BLOCK)[:n]


def test_fp32_round_trip_is_exact() -> None:
    w = _weights()
    assert np.array_equal(decode(encode_float(w, "raw"), "raw"), w)


def test_fp16_round_trip_within_its_relative_bound() -> None:
    w = np.concatenate([_weights(), np.array([1e-6, -3e-7, 0.0, 60_000.0], np.float32)])
    back = decode(encode_float(w, "fp16"), "fp16")
    assert encode_float(w, "fp16").nbytes == w.nbytes // 2
    bound = np.maximum(2.0**-11 * np.abs(w), 2.0**-25)
    assert np.all(np.abs(back - w) <= bound)


def test_q8_carries_a_whole_model_in_half_of_fp16_within_half_a_step_per_block() -> None:
    """``q8``: the whole model in int8's layout, no base; its frame names no base, and a
    corrupt or mis-sized payload is refused naming ``q8``."""
    n = 1_100
    w = (_weights(n) * np.repeat(np.array([1.0, 0.01, 10.0, 0.0, 0.5]), BLOCK)[:n]).astype(np.float32)
    payload = encode_float(w, "q8")
    back = decode(payload, "q8")
    assert payload.dtype == np.uint8 and payload.size == delta_length(n, 8) < encode_float(w, "fp16").nbytes * 0.52
    assert back.size == n and np.all(np.abs(back - w) <= _int8_bound(w, 8))
    frames = list(encode_frames(payload, kind="model", run="r", round=1, group=0, sender="server",
                                extra=FrameExtra("t"), codec="q8"))  # fmt: skip
    (got,) = [p for p in (Reassembler().add(f) for f in frames) if p is not None]
    assert got.header.codec == "q8" and got.header.base is None
    assert np.array_equal(check_weights(got, n), back)
    with pytest.raises(ProtocolError, match="q8 payload of 7 bytes"):
        decode(payload[:7], "q8")
    with pytest.raises(ProtocolError, match=f"q8 model of {payload.size} bytes does not fit a model of {n + 1}"):
        check_weights(got, n + 1)  # refused by its length, before any of it is decoded


@pytest.mark.parametrize(
    ("bits", "n", "size"), [(8, 1_100, 1_100 + 8 * 5), (4, 1_100, 550 + 8 * 5), (4, 1_101, 551 + 8 * 5)]
)
def test_delta_round_trip_within_half_a_step_per_block(bits: Bits, n: int, size: int) -> None:
    """int8: 255 steps per block, one byte per code; int4: 15 steps, two codes per byte
    (an odd count ends in a half-used byte, which the receiver's count drops)."""
    scales = np.repeat(np.array([1.0, 0.01, 10.0, 0.0, 0.5]), BLOCK)[:n]  # blocks differ; the last is partial
    d = (_weights(n) * scales).astype(np.float32)
    payload = quantise(d, bits)
    assert payload.dtype == np.uint8 and payload.size == delta_length(n, bits) == size
    back = dequantise(payload, n, bits)
    assert back.size == n
    assert np.all(np.abs(back - d) <= _int8_bound(d, bits))
    assert np.array_equal(back[3 * BLOCK : 4 * BLOCK], d[3 * BLOCK : 4 * BLOCK])  # a constant block is exact
    if bits == 4:
        coarse = np.abs(back - d)[: 3 * BLOCK].mean()
        fine = np.abs(dequantise(quantise(d)) - d)[: 3 * BLOCK].mean()
        assert coarse > 8 * fine  # truly 16 levels, not 256: 17 times the int8 step


def test_int4_codes_are_two_per_byte_low_nibble_first() -> None:
    d = np.array([0.0, 15.0, 5.0, 10.0, 1.0], np.float32)  # one block: lo 0, step 1, codes as given
    payload = quantise(d, 4)
    assert payload.view(np.uint8)[8:].tolist() == [0xF0, 0xA5, 0x01]
    assert np.array_equal(dequantise(payload, 5, 4), d)
    with pytest.raises(ProtocolError, match="does not fit a model of 7"):
        dequantise(payload, 7, 4)
    odd = payload.copy()
    odd[-1] |= 0x30  # a stray code in the half-used last byte
    with pytest.raises(ProtocolError, match="zero nibble"):
        dequantise(odd, 5, 4)
    with pytest.raises(ProtocolError, match="empty base"):
        unpack(payload, 0, bits=4)  # zlib would read a limit of 0 as none


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_carries_the_residual(bits: Bits) -> None:
    """Over many steps the decoded deltas sum to the true deltas up to the last
    residual alone; without feedback the quantisation error accumulates."""
    rng = np.random.default_rng(1)
    base = np.zeros(2_000, np.float32)
    fb = ErrorFeedback()
    sent = np.zeros_like(base)
    meant = np.zeros_like(base)
    plain = np.zeros_like(base)
    for _ in range(200):
        d = (rng.normal(0, 0.01, base.size) + 0.001).astype(np.float32)  # a small bias quantisation rounds off
        meant += d
        sent += dequantise(fb.encode(base + d, base, bits), base.size, bits)
        plain += dequantise(quantise(d, bits), base.size, bits)
    assert fb.residual is not None
    np.testing.assert_allclose(sent + fb.residual, meant, atol=1e-4 if bits == 8 else 1e-3)
    assert np.abs(meant - sent).max() <= np.abs(fb.residual).max() + 1e-4
    assert np.abs(meant - sent).mean() < np.abs(meant - plain).mean() / 3


@pytest.mark.parametrize(("bits", "codec"), [(8, "int8"), (4, "int4")])
def test_a_chain_of_ten_delta_hand_offs_stays_within_the_stated_bound_of_the_fp32_chain(bits: Bits, codec: str) -> None:
    """Each hand-off is the chain's model as a delta against the group's start model
    (which every member holds). A member trains from the model it decoded, so each
    hop's error is carried on, but never re-quantised: after k hand-offs the int8
    chain is within the sum of the k hops' bounds of the fp32 chain (codecs docstring)."""
    rng = np.random.default_rng(2)
    start = _weights(3_000, seed=3)
    exact = start.copy()  # the fp32 chain
    current = start.copy()  # the int8 chain
    allowed = np.zeros_like(start)
    for i in range(10):
        step = rng.normal(0, 0.01, start.size).astype(np.float32)  # member i's training
        exact = exact + step
        trained = current + step
        current = decode(ErrorFeedback().encode(trained, start, bits), codec, start)  # each member its own sender
        allowed += _int8_bound(trained - start, bits)
        assert np.all(np.abs(current - exact) <= allowed + 1e-6), f"hand-off {i + 1}"
    assert np.abs(current - exact).mean() < allowed.mean() / 2  # independent errors do not line up


def test_non_finite_output_goes_raw_for_the_receiver_to_refuse() -> None:
    w = _weights(10)
    w[3] = np.nan
    payload, codec = encode_output(w, np.zeros(10, np.float32), "int8", ErrorFeedback())
    assert codec == "raw" and np.isnan(payload[3])


def _one_frame(array: np.ndarray, **kw: object) -> bytes:
    (frame,) = encode_frames(array, kind="model", run="r", round=1, group=0, sender="server", **kw)  # type: ignore[arg-type]
    return frame


def test_frames_carry_codec_and_base_and_decode_with_the_base_held() -> None:
    from device.protocol import FrameExtra

    start, trained = _weights(600), _weights(600, seed=5)
    base = payload_key(encode_float(start, "fp16"))
    (frame,) = encode_frames(
        ErrorFeedback().encode(trained, start),
        kind="result",
        run="r",
        round=1,
        group=0,
        sender="dev1",
        extra=FrameExtra("t1", position=0),
        codec="int8",
        base=base,
    )
    payload = Reassembler().add(frame)
    assert payload is not None and payload.header.codec == "int8" and payload.header.base == base
    got = check_weights(payload, 600, {base: start})
    assert np.all(np.abs(got - trained) <= _int8_bound(trained - start))
    half = Reassembler().add(_one_frame(encode_float(trained, "fp16"), codec="fp16", extra=FrameExtra("t1")))
    assert half is not None and half.header.codec == "fp16" and half.header.dtype == "float16"
    assert np.allclose(check_weights(half, 600), trained, rtol=2**-11, atol=2**-25)


def test_unknown_or_corrupt_codec_fields_are_refused_with_a_reason() -> None:
    from device.protocol import FrameExtra

    start, trained = _weights(600), _weights(600, seed=5)
    base = payload_key(encode_float(start, "fp16"))
    delta = ErrorFeedback().encode(trained, start)
    frame = _one_frame(delta, codec="int8", base=base, extra=FrameExtra("t1"))
    with pytest.raises(ProtocolError, match="codec must be one of"):
        parse_frame(_rebuild(frame, codec="int3"))
    with pytest.raises(ProtocolError, match="names its base"):
        parse_frame(_rebuild(frame, base=None))
    with pytest.raises(ProtocolError, match="base must be 64"):
        parse_frame(_rebuild(frame, base="v1"))
    with pytest.raises(ProtocolError, match="cannot be uint8"):
        parse_frame(_rebuild(frame, codec="fp16", base=None))
    with pytest.raises(ProtocolError, match="names its base"):
        parse_frame(_rebuild(_one_frame(trained, extra=FrameExtra("t1")), base=base))
    payload = Reassembler().add(frame)
    assert payload is not None
    with pytest.raises(ProtocolError, match="does not hold"):
        check_weights(payload, 600, {})
    with pytest.raises(ProtocolError, match="does not hold"):
        check_weights(payload, 600)
    with pytest.raises(ProtocolError, match="does not fit a model of 700"):
        check_weights(payload, 700, {base: np.zeros(700, np.float32)})
    bad = delta.copy()
    bad[:4] = np.frombuffer(np.float32(-1.0).tobytes(), np.uint8)  # a negative scale
    corrupt = Reassembler().add(_one_frame(bad, codec="int8", base=base, extra=FrameExtra("t1")))
    assert corrupt is not None
    with pytest.raises(ProtocolError, match="corrupt"):
        check_weights(corrupt, 600, {base: start})
    with pytest.raises(ProtocolError, match="fits no number"):
        dequantise(delta[:270])  # 2 blocks need 16 bytes of scales and offsets and 257 codes at least
    with pytest.raises(ProtocolError, match="unknown codec"):
        decode(delta, "zstd")
    with pytest.raises(ProtocolError, match="an int4 delta of 624 bytes does not fit a model of 600"):
        check_weights(Reassembler().add(_rebuild(frame, codec="int4")), 600, {base: start})  # type: ignore[arg-type]


def test_int4_frames_decode_with_the_base_held_and_deflate_losslessly() -> None:
    start = _weights(5_001)
    trained = start.copy()
    trained[:1_000] += _weights(1_000, seed=3) * 0.01
    base = payload_key(encode_float(start, "fp16"))
    payload, codec = encode_output(trained, start, "int4", ErrorFeedback())
    assert codec == "int4z" and payload.size < delta_length(5_001, 4) / 2
    assert np.array_equal(unpack(payload, 5_001, bits=4), quantise(trained - start, 4))
    frame = Reassembler().add(_one_frame(payload, codec=codec, base=base, extra=FrameExtra("t1")))
    assert frame is not None and frame.header.codec == "int4z"
    got = check_weights(frame, 5_001, {base: start})
    assert np.all(np.abs(got - trained) <= _int8_bound(trained - start, 4))
    noise = quantise(np.random.default_rng(1).uniform(-1, 1, 5_000).astype(np.float32), 4)
    assert pack(noise, bits=4)[1] == "int4"  # 4-bit codes of noise do not deflate
    oversized = Reassembler().add(
        _one_frame(np.concatenate([payload, payload]), codec="int4z", base=base, extra=FrameExtra("t1"))
    )
    assert oversized is not None
    with pytest.raises(ProtocolError, match="oversized"):
        check_weights(oversized, 5_001, {base: start})
    as_big = Reassembler().add(  # an int4z no smaller than its int4 payload: never inflated
        _one_frame(quantise(trained - start, 4), codec="int4z", base=base, extra=FrameExtra("t1"))
    )
    assert as_big is not None
    with pytest.raises(ProtocolError, match="no smaller than its int4 payload"):
        check_weights(as_big, 5_001, {base: start})
    with pytest.raises(ProtocolError, match="exactly 2501 bytes"):
        decode(
            np.concatenate([payload[:160], np.frombuffer(zlib.compress(bytes(4_000)), np.uint8)]),
            "int4z",
            start,
        )


def test_int8z_deflates_runs_of_equal_codes_losslessly() -> None:
    start = _weights(5_000)
    trained = start.copy()
    trained[:1_000] += _weights(1_000, seed=3) * 0.01  # the rest got no gradient: one code, in runs
    payload = ErrorFeedback().encode(trained, start)
    packed, codec = pack(payload, bits=8)
    assert codec == "int8z" and packed.size < payload.size / 2
    assert np.array_equal(unpack(packed, 5_000, bits=8), payload)
    assert np.array_equal(decode(packed, "int8z", start), decode(payload, "int8", start))
    noise = quantise(np.random.default_rng(1).uniform(-1, 1, 5_000).astype(np.float32))
    assert pack(noise, bits=8)[1] == "int8"  # codes that do not deflate go as they are


def test_corrupt_or_oversized_int8z_payloads_are_refused_never_inflated_beyond_the_model() -> None:
    import zlib

    start = np.zeros(5_000, np.float32)
    head = quantise(start)[: 8 * 20]  # 20 blocks of scales and offsets
    packed, _ = pack(quantise(_weights(5_000) * (np.arange(5_000) < 300)), bits=8)
    broken = packed.copy()
    broken[8 * 20 + 4 :] ^= 0x5A
    with pytest.raises(ProtocolError, match="corrupt"):
        decode(broken, "int8z", start)
    bomb = np.concatenate([head, np.frombuffer(zlib.compress(bytes(1_000_000)), np.uint8)])  # 1 MB of zeros
    assert bomb.size < int8_length(5_000)  # smaller than an honest payload
    with pytest.raises(ProtocolError, match="exactly 5000 bytes"):
        decode(bomb, "int8z", start)
    short = np.concatenate([head, np.frombuffer(zlib.compress(bytes(4_000)), np.uint8)])
    with pytest.raises(ProtocolError, match="exactly 5000 bytes"):
        decode(short, "int8z", start)
    with pytest.raises(ProtocolError, match="cannot hold"):
        decode(head, "int8z", start)
    frame = _one_frame(bomb, codec="int8z", base=payload_key(head), extra=FrameExtra("t1"))
    big = Reassembler().add(frame)
    assert big is not None
    with pytest.raises(ProtocolError, match="exactly 5000 bytes"):
        check_weights(big, 5_000, {payload_key(head): start})
