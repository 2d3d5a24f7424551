"""A msgspec fast path in front of the codec's decoder, for hosts that decode every record.

:func:`decode_fast` gives exactly what :func:`events.codec.decode` gives — the same event
(equal, and encoding to the same bytes) or the same dead letter — faster for the
high-volume event types (1.03-1.29x the codec's decode over a replay's mix,
``benchmarks/replay_throughput.py``; most on the wide telemetry events). How:

- Each event class whose fields msgspec can check exactly as pydantic does (str, int,
  float, bool, ``None`` unions, ``Literal``, ``UUID``, tuples of those, and
  :data:`~events.envelope.Attributes`; numbers with bounds and finiteness; no validators
  of its own, no other constraints) gets a
  msgspec ``Struct`` twin: the same fields in the same order, unknown fields forbidden,
  strict types (no coercion: msgspec refuses what pydantic's lax mode would convert).
- A record names its type in ``"type":"..."``; that picks the twin, whose ``type`` field
  is the class's ``Literal`` tag, so a wrong pick cannot pass.
- The decoded fields become the pydantic model without a second validation (its
  ``__dict__`` in declaration order: what the serializer writes back, byte for byte).
- The envelope's checked fields (ids, producer name, a finite ``ts``) are decoded plain and
  checked with the envelope's own functions (:func:`events.identity.check_id`; an id seen
  before is a set lookup).
- Anything the twin refuses — another schema version (upcasting), NaN or infinities
  (not JSON to msgspec), a value pydantic would coerce, a bad record, a type without a
  twin — goes through :func:`events.codec.decode`, which upcasts or dead-letters it as
  always. The fast path only ever answers for records pydantic accepts unchanged.

``tests/unit/events/test_fast_decode.py`` holds both paths equal on every event type,
valid and mutated (hypothesis).
"""

from __future__ import annotations

import re
import sys
import types
import typing
import uuid
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, Union

import msgspec
from pydantic import BaseModel

from events.codec import decode
from events.dead_letter import DeadLetter
from events.envelope import MAX_INT, EventBase, _to_pairs, event_classes
from events.identity import PASSED_IDS, PASSED_NAMES, check_id, check_name

_Int = Annotated[int, msgspec.Meta(ge=-MAX_INT, le=MAX_INT)]
_Scalar = Union[str, _Int, float, bool, None]  # noqa: UP007 (msgspec takes typing forms)
_ATOMS = (str, int, float, bool, type(None), uuid.UUID)
_new = object.__new__
_set = object.__setattr__
_asdict = msgspec.structs.asdict
# the model's slots, set through their descriptors (what object.__setattr__ finds, found once)
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


class _Unsupported(Exception):
    """A field msgspec cannot check exactly as pydantic does: no twin for its class."""


def _twin_type(annotation: Any) -> Any:
    """The msgspec type that accepts exactly what pydantic accepts, unchanged."""
    if annotation in _ATOMS:
        return annotation
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        if all(type(a) is str for a in args):
            return annotation
        raise _Unsupported(annotation)
    if origin is Annotated:  # a bounded number inside a union or a tuple (``Int | None``)
        return _bounded(args[0], list(args[1:]))
    if origin in (Union, types.UnionType):
        return Union[tuple(_twin_type(a) for a in args)]  # noqa: UP007
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple[_twin_type(args[0]), ...]  # type: ignore[misc]
    raise _Unsupported(annotation)


#: bounds pydantic checks that msgspec checks alike (``annotated_types`` name -> Meta key)
_BOUNDS = {"Ge": "ge", "Gt": "gt", "Le": "le", "Lt": "lt"}
_MAX_FLOAT = sys.float_info.max


def _bounded(annotation: Any, metadata: list[Any]) -> Any:
    """A number with bounds (``Field(ge=0, allow_inf_nan=False)``) as msgspec checks it.

    JSON has no NaN, and msgspec refuses ``NaN``/``Infinity`` tokens (the codec decides
    those); but it reads ``1e999`` as infinity, so a float that must be finite is bounded
    by the largest finite float too."""
    if annotation not in (int, float):
        raise _Unsupported(annotation)
    meta: dict[str, Any] = {}
    for item in metadata:
        name = type(item).__name__
        if name in _BOUNDS:
            meta[_BOUNDS[name]] = getattr(item, _BOUNDS[name])
        elif name == "AllowInfNan" and not item.allow_inf_nan and annotation is float:
            meta.setdefault("le", _MAX_FLOAT)
            meta.setdefault("ge", -_MAX_FLOAT)
        else:
            raise _Unsupported(item)
    return Annotated[annotation, msgspec.Meta(**meta)]


def _is_attributes(field: Any) -> bool:
    return any(getattr(m, "func", None) is _to_pairs for m in field.metadata)


class _Twin:
    """One event class's fast decoder."""

    __slots__ = ("cls", "decoder", "fields_set", "pairs", "version")

    def __init__(self, cls: type[EventBase]) -> None:
        own = cls.__pydantic_decorators__
        if own.field_validators or own.validators or own.root_validators:
            raise _Unsupported(cls)
        if [v for v in own.model_validators if v != "_current_version"]:
            raise _Unsupported(cls)
        fields: list[tuple[Any, ...]] = []
        self.pairs: tuple[str, ...] = ()
        for name, field in cls.model_fields.items():
            if field.default_factory is not None:
                raise _Unsupported(cls)
            if _is_attributes(field):
                kind: Any = dict[str, _Scalar]
                self.pairs = (*self.pairs, name)
            elif name in _ENVELOPE_CHECKED:
                # the envelope's checked fields: decoded plain, checked in decode() by the
                # envelope's own checks (only while they are the envelope's fields as-is)
                if field.metadata != EventBase.model_fields[name].metadata:
                    raise _Unsupported(cls)
                kind = _ENVELOPE_CHECKED[name]
            elif field.metadata:
                kind = _bounded(field.annotation, field.metadata)
            elif name == "schema_version":
                # only the current version decodes here (an older one is upcast by the
                # codec); a record without one is the field's default, if that is current
                kind = Literal[cls.SCHEMA_VERSION]
                if field.default != cls.SCHEMA_VERSION:
                    fields.append((name, kind))
                    continue
            else:
                kind = _twin_type(field.annotation)
            if field.is_required() or name == "type":  # pydantic's union needs the tag
                fields.append((name, kind))
            else:
                default = field.default
                if name in self.pairs:
                    default = msgspec.field(default_factory=dict)
                elif not isinstance(default, (*_ATOMS, tuple)):
                    raise _Unsupported(cls)
                fields.append((name, kind, default))
        struct = msgspec.defstruct(
            f"{cls.__name__}Twin", fields, kw_only=True, forbid_unknown_fields=True
        )
        self.cls = cls
        self.decoder = msgspec.json.Decoder(struct)
        #: one set shared by every event this twin decodes: frozen models never add to
        #: it, and ``model_copy`` copies it before it adds (a test holds both)
        self.fields_set = set(cls.model_fields)

    def decode(self, raw: bytes) -> EventBase | None:
        """The event, or None when pydantic must decide (see the module docstring)."""
        try:
            values = _asdict(self.decoder.decode(raw))
        except Exception:  # refused (bad UTF-8 too): the codec decides, and says why
            return None
        if (  # the envelope's checks (ids seen before passed them: a set lookup)
            values["run_id"] not in _PASSED_IDS
            or values["tenant_id"] not in _PASSED_IDS
            or values["producer"] not in _PASSED_NAMES
        ) and not _envelope_ok(values):
            return None
        if not -_FINITE < values["ts"] < _FINITE:  # msgspec reads 1e999 as inf; NaN fails too
            return None
        for name in self.pairs:  # what the Attributes validator makes of a str-keyed dict
            found = values[name]
            values[name] = tuple(sorted(found.items())) if found else ()
        event = _new(self.cls)
        _set(event, "__dict__", values)
        # pydantic would record the fields present in the record; every field is set on
        # the model either way, and nothing here reads the difference
        _set_fields_set(event, self.fields_set)
        _set_extra(event, None)
        _set_private(event, None)
        return event


#: The envelope fields pydantic checks beyond their type, as the twin decodes them.
_ENVELOPE_CHECKED: dict[str, Any] = {"tenant_id": str, "run_id": str, "producer": str, "ts": float}
_PASSED_IDS, _PASSED_NAMES = PASSED_IDS, PASSED_NAMES
_FINITE = float("inf")


def _envelope_ok(values: dict[str, Any]) -> bool:
    """Do the decoded envelope fields pass the checks pydantic runs on them?"""
    try:
        check_id(values["run_id"])
        check_id(values["tenant_id"])
        check_name(values["producer"])
    except ValueError:
        return False
    return True


def _twins() -> dict[bytes, _Twin]:
    out: dict[bytes, _Twin] = {}
    for tag, cls in event_classes().items():
        try:
            out[tag.encode()] = _Twin(cls)
        except _Unsupported:
            continue
    return out


_TWINS = _twins()
_TYPE = b'"type":"'
_SPACED_TYPE = re.compile(rb'"type"\s*:\s*"([^"\\]*)"')


def decode_fast(raw: bytes) -> EventBase | DeadLetter:
    """:func:`events.codec.decode`, faster for the types with a twin (same result)."""
    start = raw.find(_TYPE)
    if start >= 0:  # the codec's own spelling
        start += 8
        tag = raw[start : raw.find(b'"', start)]
    else:
        found = _SPACED_TYPE.search(raw) if type(raw) is bytes else None
        tag = found.group(1) if found else b""
    twin = _TWINS.get(tag)
    if twin is not None:
        event = twin.decode(raw)
        if event is not None:
            return event
    return decode(raw)


def decode_many(values: Iterable[bytes]) -> list[EventBase | DeadLetter]:
    """:func:`decode_fast` of each record."""
    fast: Callable[[bytes], EventBase | DeadLetter] = decode_fast
    return [fast(v) for v in values]


def fast_types() -> list[str]:
    """The event types with a twin (the rest always take the codec's path)."""
    return sorted(t.decode() for t in _TWINS)
