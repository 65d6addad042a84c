"""Typed JSON bodies: frozen dataclasses checked on the way in, and their JSON Schema.

Every control-message body of the protocol is a frozen dataclass whose fields carry
plain types (``int``, ``float``, ``str``, ``bool``, ``Literal``, ``tuple[T, ...]``,
``T | None``, another body, or a tagged union of bodies) and, with
``Annotated[...]``, the constraints a receiver checks (:class:`AtLeast`,
:class:`Above`, :class:`MaxLen`, :class:`Identifier`). One description serves three
purposes: :func:`from_body` validates and builds, :func:`to_body` writes, and
:func:`json_schema` publishes the schema in ``docs/protocol.schema.json``. A third
party reads the schema; covey's tests check that the code and the schema agree.

Rules a receiver follows (and that the schema states):

* a required field that is missing, has the wrong JSON type, or breaks a constraint
  is refused with a :class:`~device.errors.ProtocolError` that names the field;
* JSON ``true``/``false`` is never a number; numbers must be finite;
* fields a receiver does not know are ignored, so a later minor revision may add
  optional fields without breaking older parties.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from device.errors import ProtocolError

T = TypeVar("T")


@dataclass(frozen=True)
class AtLeast:
    """Inclusive lower bound of a number (or the minimum length of a tuple)."""

    value: float


@dataclass(frozen=True)
class Above:
    """Exclusive lower bound of a number."""

    value: float


@dataclass(frozen=True)
class MaxLen:
    """Maximum length of a string or a tuple."""

    value: int


@dataclass(frozen=True)
class Identifier:
    """A topic level: 1-64 printable characters without ``/ + #`` or spaces."""

    what: str = "id"


ID_PATTERN = r"^[^/+# \x00-\x1f\x7f]{1,64}$"


_NOT_IN_IDS = frozenset("/+# ")


def check_identifier(value: str, what: str) -> str:
    if not value or len(value) > 64 or not _NOT_IN_IDS.isdisjoint(value) or not value.isprintable():
        raise ProtocolError(f"{what} {_short(value)} must be 1-64 printable characters without '/', '+', '#', ' '")
    return value


# -- reading --------------------------------------------------------------------------------


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error never echoes a huge input."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _split_annotated(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    if get_origin(tp) is Annotated:
        base, *extras = get_args(tp)
        return base, tuple(extras)
    return tp, ()


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, resolved once per class. ``get_type_hints`` evaluates every
    (string) annotation each time it is called: 20 ``compile`` calls per frame header,
    most of what reading a small model frame cost (``bench/transport.py``)."""
    return get_type_hints(cls, include_extras=True)


def _tag_of(cls: type) -> tuple[str, Any] | None:
    """The discriminating field of a union member: its one ``Literal`` field with one value."""
    for f in dataclasses.fields(cls):
        hint = _hints(cls)[f.name]
        base, _ = _split_annotated(hint)
        if get_origin(base) is Literal and len(get_args(base)) == 1:
            return f.name, get_args(base)[0]
    return None


def _check_constraints(value: Any, extras: tuple[Any, ...], where: str) -> None:
    for c in extras:
        if isinstance(c, AtLeast):
            size = len(value) if isinstance(value, tuple) else value
            if size < c.value:
                what = "have at least" if isinstance(value, tuple) else "be at least"
                raise ProtocolError(f"{where} must {what} {c.value:g}, got {_short(value)}")
        elif isinstance(c, Above) and not value > c.value:
            raise ProtocolError(f"{where} must be above {c.value:g}, got {_short(value)}")
        elif isinstance(c, MaxLen) and len(value) > c.value:
            raise ProtocolError(f"{where} holds {len(value)} items; at most {c.value} are allowed")
        elif isinstance(c, Identifier):
            check_identifier(value, f"{where} ({c.what})")


def read_value(tp: Any, raw: Any, where: str) -> Any:
    """Validate ``raw`` against type ``tp`` (a body class, a tagged union of them, or a field type)."""
    return _reader(tp)(raw, where)


Reader = Callable[[Any, str], Any]  # (raw JSON value, where it sits) -> the checked value


def _reader(tp: Any) -> Reader:
    """The reader of type ``tp``, built once per type: what to check is decided there,
    not for every value read, as every frame that arrives is read through it (what
    reading a model frame costs besides its sha256: docs/results.md, "Transport").

    Cached by the type and its arguments in order: ``Literal["a", "b"]`` and
    ``Literal["b", "a"]`` are equal types, but their error messages list the values
    in their own order. A type whose metadata cannot be hashed is built each time."""
    key = (tp, get_args(tp))
    try:
        hash(key)
    except TypeError:
        return _build_reader(tp)
    return _cached_reader(key)


@functools.cache
def _cached_reader(key: tuple[Any, tuple[Any, ...]]) -> Reader:
    return _build_reader(key[0])


def _build_reader(tp: Any) -> Reader:
    base, extras = _split_annotated(tp)
    read_base = _base_reader(base)
    if not extras:
        return read_base

    def read(raw: Any, where: str) -> Any:
        value = read_base(raw, where)
        if value is not None:
            _check_constraints(value, extras, where)
        return value

    return read


def _read_bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise ProtocolError(f"{where} must be true or false, got {_short(raw)}")
    return raw


def _read_int(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ProtocolError(f"{where} must be an integer, got {_short(raw)}")
    return raw


def _read_float(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ProtocolError(f"{where} must be a finite number, got {_short(raw)}")
    try:
        value = float(raw)  # an integer beyond the float range overflows
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ProtocolError(f"{where} must be a finite number, got {_short(raw)}")
    return value


def _read_str(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ProtocolError(f"{where} must be a string, got {_short(raw)}")
    return raw


def _read_any(raw: Any, where: str) -> Any:
    return raw


def _read_dict(raw: Any, where: str) -> dict[Any, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where} must be an object, got {type(raw).__name__}")
    return dict(raw)


def _base_reader(tp: Any) -> Reader:
    simple: dict[Any, Reader] = {Any: _read_any, bool: _read_bool, int: _read_int, float: _read_float, str: _read_str}
    if _is_union(tp):
        return _union_reader(tp)
    if tp in simple:
        return simple[tp]
    if get_origin(tp) is Literal:
        allowed = get_args(tp)
        has_bool = any(isinstance(a, bool) for a in allowed)

        def read_literal(raw: Any, where: str) -> Any:
            if raw not in allowed or isinstance(raw, bool) != has_bool:
                raise ProtocolError(f"{where} must be one of {list(allowed)}, got {_short(raw)}")
            return raw

        return read_literal
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        kind = tp

        def read_enum(raw: Any, where: str) -> Any:
            try:
                return kind(raw)
            except ValueError:
                raise ProtocolError(f"{where} must be one of {[m.value for m in kind]}, got {_short(raw)}") from None

        return read_enum
    if get_origin(tp) is tuple:
        item, ellipsis = get_args(tp)
        assert ellipsis is Ellipsis, "only tuple[T, ...] is supported"
        read_item = _reader(item)

        def read_tuple(raw: Any, where: str) -> tuple[Any, ...]:
            if not isinstance(raw, list):
                raise ProtocolError(f"{where} must be a list, got {type(raw).__name__}")
            return tuple(read_item(v, f"{where}[{i}]") for i, v in enumerate(raw))

        return read_tuple
    if get_origin(tp) is dict:
        return _read_dict
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return functools.partial(from_body, tp)
    raise TypeError(f"unsupported field type {tp!r}")  # a bug in a body definition


def _union_reader(tp: Any) -> Reader:
    options = [a for a in get_args(tp) if a is not type(None)]
    nullable = len(options) < len(get_args(tp))
    read_one = _reader(options[0]) if len(options) == 1 else functools.partial(_read_tagged, options)

    def read_union(raw: Any, where: str) -> Any:
        if raw is None:
            if nullable:
                return None
            raise ProtocolError(f"{where} must not be null")
        return read_one(raw, where)

    return read_union


@functools.cache
def _tags(options: tuple[Any, ...]) -> dict[Any, tuple[str, Any]]:
    """A tagged union's members by their tag value: (tag field, class)."""
    tags = {}
    for cls in options:
        tag = _tag_of(cls)
        assert tag is not None, f"union member {cls.__name__} has no Literal tag field"
        tags[tag[1]] = (tag[0], cls)
    return tags


def _read_tagged(options: list[Any], raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where} must be an object, got {type(raw).__name__}")
    tags = _tags(tuple(options))
    field_name = next(iter(tags.values()))[0]
    value = raw.get(field_name)
    chosen = tags.get(value) if isinstance(value, str) else None  # tags are strings; a list is unhashable
    if chosen is None:
        raise ProtocolError(f"{where}.{field_name} must be one of {list(tags)}, got {_short(value)}")
    return from_body(chosen[1], raw, where)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, bool, Reader], ...]:
    """``cls``'s fields as (name, required, reader), once per class."""
    hints = _hints(cls)
    return tuple(
        (
            f.name,
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            _field_reader(cls, f.name, hints[f.name]),
        )
        for f in dataclasses.fields(cls)
    )


def _field_reader(cls: type, name: str, tp: Any) -> Reader:
    """The reader of field ``name``; a type no reader supports (a bug in a body
    definition) fails when such a field is read, naming it, as it did before readers
    were built ahead (an absent optional field of that type is never read)."""
    try:
        return _reader(tp)
    except TypeError as exc:
        why = f"{cls.__name__}.{name}: {exc}"

        def unsupported(raw: Any, where: str) -> Any:
            raise TypeError(f"{why} (at {where})")

        return unsupported


def from_body(cls: type[T], raw: Any, where: str = "body") -> T:
    """Validate ``raw`` (parsed JSON) against body class ``cls`` and build it.

    Raises :class:`ProtocolError` naming the first field that is missing, of the
    wrong type or out of range. Unknown fields are ignored.
    """
    if not isinstance(raw, Mapping):
        raise ProtocolError(f"{where} must be a JSON object, got {type(raw).__name__}")
    values: dict[str, Any] = {}
    for name, required, read in _fields(cls):  # type: ignore[arg-type]  # a class is hashable; mypy sees a TypeVar
        if name not in raw:
            if required:
                raise ProtocolError(f"{where}.{name} is missing")
            continue
        values[name] = read(raw[name], f"{where}.{name}")
    try:
        return cls(**values)
    except (ValueError, TypeError, ArithmeticError) as exc:  # a body's own cross-field check
        raise ProtocolError(f"{where}: {exc}") from None


# -- writing -------------------------------------------------------------------------------


_PLAIN = frozenset({str, int, bool, type(None)})  # written as they are (exact types: not enums)


def _write(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise ProtocolError(f"cannot send the non-finite number {value!r}")
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_body(value)
    if isinstance(value, (tuple, list)):
        return [_write(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"cannot send the non-finite number {value!r}")
    return value


def to_body(obj: Any) -> dict[str, Any]:
    """The JSON object of a body (every field, ``None`` as ``null``)."""
    return {name: _write(getattr(obj, name)) for name in _field_names(type(obj))}  # type: ignore[arg-type]  # a class is hashable


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


# -- JSON Schema ----------------------------------------------------------------------------


def _schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    base, extras = _split_annotated(tp)
    out = _schema_base(base, defs)
    for c in extras:
        if isinstance(c, AtLeast):
            out["minItems" if out.get("type") == "array" else "minimum"] = (
                int(c.value) if out.get("type") in ("array", "integer") else c.value
            )
        elif isinstance(c, Above):
            out["exclusiveMinimum"] = c.value
        elif isinstance(c, MaxLen):
            out["maxItems" if out.get("type") == "array" else "maxLength"] = c.value
        elif isinstance(c, Identifier):
            out["pattern"] = ID_PATTERN
            out["description"] = f"{c.what}: 1-64 printable characters without '/', '+', '#' or spaces"
    return out


def _schema_base(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    if _is_union(tp):
        options = [a for a in get_args(tp) if a is not type(None)]
        variants = [_schema(a, defs) for a in options]
        if len(options) < len(get_args(tp)):
            variants.append({"type": "null"})
        return variants[0] if len(variants) == 1 else {"oneOf": variants}
    if tp is Any:
        return {}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        return {"type": simple[tp]}
    if get_origin(tp) is Literal:
        allowed = list(get_args(tp))
        return {"const": allowed[0]} if len(allowed) == 1 else {"enum": allowed}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if get_origin(tp) is tuple:
        return {"type": "array", "items": _schema(get_args(tp)[0], defs)}
    if get_origin(tp) is dict:
        return {"type": "object"}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder against recursion
            defs[tp.__name__] = object_schema(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"unsupported field type {tp!r}")


def object_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of one body class (nested bodies go to ``defs``)."""
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        props[f.name] = _schema(hints[f.name], defs)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        elif f.default is not dataclasses.MISSING:
            props[f.name]["default"] = _write(f.default)
    schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    doc = (cls.__doc__ or "").strip()
    if doc:
        schema["description"] = " ".join(doc.split())
    return schema


def json_schema(cls: type) -> dict[str, Any]:
    """A self-contained JSON Schema (draft 2020-12) for one body class."""
    defs: dict[str, Any] = {}
    root = object_schema(cls, defs)
    if defs:
        root["$defs"] = defs
    return root
