"""Mutations of valid encodings, byte-level and structure-level.

Byte-level (AFL's classic havoc stages, Zalewski 2014): bit flips, random bytes,
truncation, insertion, deletion, duplication of a slice, and splices of two valid
inputs. Structure-level, for JSON and TOML documents (a frame header is JSON too):
a random node of the parsed tree is replaced by a value of another type, a huge or
boundary number, a deeply nested list, a long or non-printable string; a field is
deleted, or an unknown one added. Deep nesting and non-standard number tokens
(``NaN``, ``1e999``) are spliced into the text after encoding, because the encoders
refuse to write them.

Every function is pure given its ``np.random.Generator``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# numbers at the edges of what a decoder may handle: 32/64-bit limits, beyond float range
INTERESTING_INTS = (0, -1, 1, 255, 256, 65_536, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63))
RAW_TOKENS = (
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "1" + "0" * 400,
    "-" + "9" * 400,
    "1" * 5000,
    "1e-400",
    "-0",
)
STRINGS = ("", " ", "a/b", "+", "#", "\x00", "\u202e", "é" * 3, "x" * 70, "x" * 5000, "server", "../../etc")
_MARK = "\u0000covey-fuzz-raw-"


def raw(token: str) -> str:
    """A placeholder that :func:`dumps_json` / :func:`dumps_toml` write as ``token`` verbatim."""
    return f"{_MARK}{token}\u0000"


def deep(depth: int, opener: str = "[") -> str:
    """A placeholder for ``depth`` nested lists (or JSON objects with ``opener="{"``)."""
    if opener == "{":
        return raw('{"a":' * depth + "1" + "}" * depth)
    return raw("[" * depth + "]" * depth)


def _splice_raw(text: str, quoted: bool) -> str:
    """Replace every placeholder (as the encoder quoted it) by its raw token."""
    start = '"' + json.dumps(_MARK)[1:-1] if quoted else '"' + _MARK
    while True:
        i = text.find(start)
        if i < 0:
            return text
        end_mark = json.dumps("\u0000")[1:-1] + '"' if quoted else '\u0000"'
        j = text.find(end_mark, i + len(start))
        if j < 0:
            return text
        token = text[i + len(start) : j]
        if quoted:
            token = json.loads(f'"{token}"')
        text = text[:i] + token + text[j + len(end_mark) :]


def dumps_json(tree: Any) -> bytes:
    """JSON text of ``tree``, with :func:`raw` placeholders written verbatim."""
    return _splice_raw(json.dumps(tree, separators=(",", ":")), quoted=True).encode("utf-8", "surrogatepass")


def weird_value(rng: np.random.Generator) -> Any:
    """A value of a random kind: null, bool, boundary or huge number, odd string,
    empty or deep container, a non-standard number token."""
    kind = int(rng.integers(12))
    if kind == 0:
        return None
    if kind == 1:
        return bool(rng.integers(2))
    if kind == 2:
        return int(rng.choice(INTERESTING_INTS)) * int(rng.choice((1, -1)))
    if kind == 3:
        return float(rng.choice((0.0, -0.0, 1e-320, 1e308, -1e308, 0.5, 3.0e38)))
    if kind == 4:
        return str(rng.choice(STRINGS))
    if kind == 5:
        return raw(str(rng.choice(RAW_TOKENS)))
    if kind == 6:
        return []
    if kind == 7:
        return {}
    if kind == 8:
        return deep(int(rng.choice((2, 50, 999, 1500, 5000, 20_000))), str(rng.choice(["[", "{"])))
    if kind == 9:
        return [0] * int(rng.choice((1, 8, 1000, 20_000)))
    if kind == 10:
        return {"a": 1, "nested": {"b": [1, "x", None]}}
    return int(rng.integers(-(2**62), 2**62))


def _paths(tree: Any, prefix: tuple[Any, ...] = (), out: list[tuple[Any, ...]] | None = None) -> list[tuple[Any, ...]]:
    out = [] if out is None else out
    out.append(prefix)
    if isinstance(tree, dict):
        for k, v in tree.items():
            _paths(v, (*prefix, k), out)
    elif isinstance(tree, list):
        for i, v in enumerate(tree[:64]):
            _paths(v, (*prefix, i), out)
    return out


def _copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy(v) for v in tree]
    return tree


def mutate_tree(tree: Any, rng: np.random.Generator, n: int = 1) -> Any:
    """``tree`` (parsed JSON/TOML) with ``n`` structural mutations; the input is not changed."""
    tree = _copy(tree)
    for _ in range(n):
        paths = _paths(tree)
        path = paths[int(rng.integers(len(paths)))]
        op = int(rng.integers(8))
        if not path:
            if op == 0:
                tree = weird_value(rng)
            elif isinstance(tree, dict):
                tree[str(rng.choice(("extra", "__proto__", "", "v", "type", "body")))] = weird_value(rng)
            continue
        parent = tree
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        value = parent[key]
        if op == 0 and isinstance(parent, dict):
            del parent[key]
        elif op == 1 and isinstance(parent, dict):
            parent[f"{key}_unknown"] = weird_value(rng)
        elif op == 2:
            if not isinstance(value, list):
                parent[key] = [value]
            elif len(value) <= 100:
                parent[key] = value * int(rng.choice((0, 2, 50)))
        elif op == 3 and isinstance(value, (int, float)) and not isinstance(value, bool):
            parent[key] = _near(value, rng)
        elif op == 4:
            parent[key] = str(value) if not isinstance(value, str) else _number_from(value, rng)
        else:
            parent[key] = weird_value(rng)
    return tree


def _near(value: float, rng: np.random.Generator) -> Any:
    """A number next to ``value``: off by one, negated, scaled, or a float for an int."""
    choice = int(rng.integers(6))
    if choice == 0:
        return value + 1
    if choice == 1:
        return value - 1
    if choice == 2:
        return -value
    if choice == 3:
        return value * 10 ** int(rng.integers(1, 30)) if isinstance(value, int) else value * 1e300
    if choice == 4:
        try:
            return float(value) + 0.5 if math.isfinite(float(value)) else 0.5
        except OverflowError:  # an int beyond float range
            return 1e308
    return raw(str(rng.choice(RAW_TOKENS)))


def _number_from(text: str, rng: np.random.Generator) -> Any:
    try:
        return int(text)
    except ValueError:
        return len(text) * int(rng.choice((1, -1)))


def mutate_bytes(data: bytes, rng: np.random.Generator, pool: Sequence[bytes]) -> bytes:
    """``data`` after 1-4 byte-level mutations (the havoc stage of a fuzzer)."""
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        op = int(rng.integers(9))
        n = len(buf)
        if op == 0 and n:  # flip bits
            for _ in range(int(rng.integers(1, 9))):
                i = int(rng.integers(n))
                buf[i] ^= 1 << int(rng.integers(8))
        elif op == 1 and n:  # random bytes, or an interesting byte (0, 0xff, a digit, a quote)
            for _ in range(int(rng.integers(1, 5))):
                buf[int(rng.integers(n))] = int(rng.choice((0, 0xFF, 0x7F, 0x80, ord("9"), ord('"'), ord("["))))
        elif op == 2:  # truncate
            del buf[int(rng.integers(n + 1)) :]
        elif op == 3:  # insert random bytes
            i = int(rng.integers(n + 1))
            buf[i:i] = rng.integers(0, 256, int(rng.integers(1, 65)), dtype=np.uint8).tobytes()
        elif op == 4 and n:  # delete a slice
            i = int(rng.integers(n))
            del buf[i : i + int(rng.integers(1, 65))]
        elif op == 5 and n:  # duplicate a slice (grows a chunk beyond what its header says)
            i = int(rng.integers(n))
            piece = buf[i : i + int(rng.integers(1, 4097))]
            buf[i:i] = piece * int(rng.integers(1, 4))
        elif op == 6 and pool:  # splice with another valid input
            other = pool[int(rng.integers(len(pool)))]
            buf = buf[: int(rng.integers(n + 1))] + bytearray(other[int(rng.integers(len(other) + 1)) :])
        elif op == 7 and n >= 4:  # overwrite 4 bytes with a little-endian boundary integer
            i = int(rng.integers(n - 3))
            buf[i : i + 4] = int(rng.choice((0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 4096, 4097))).to_bytes(4, "little")
        elif op == 8:  # repeat the whole input
            buf = buf * int(rng.integers(2, 4))
    return bytes(buf)


def dumps_toml(tree: Any) -> bytes:
    """TOML text of a parsed document (tables of scalars, lists and inline tables);
    ``None`` values are left out (TOML has no null). Placeholders are written raw."""
    if not isinstance(tree, dict):
        return _toml_value(tree).encode("utf-8", "surrogatepass")
    lines = []
    tables = []
    for key, value in tree.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif value is not None:
            lines.append(f"{json.dumps(str(key))} = {_toml_value(value)}")
    for key, table in tables:
        lines.append(f"[{json.dumps(str(key))}]")
        lines += [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in table.items() if v is not None]
    return _splice_raw("\n".join(lines) + "\n", quoted=True).encode("utf-8", "surrogatepass")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        pairs = (f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(pairs) + "}"
    return json.dumps(str(value))
