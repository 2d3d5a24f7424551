"""The one codec: event -> bytes, and bytes -> event or dead letter.

(Hosts that decode every record use :func:`events.fast_decode.decode_fast`: the same
answers as :func:`decode`, faster; this module stays the reference.)

Wire format: UTF-8 JSON of the flat event (envelope fields and payload side by side),
NaN/Infinity written as JSON constants. ``decode`` never raises: anything that does not
decode, is not a known type, is from a future schema version, or fails validation comes
back as a :class:`~events.dead_letter.DeadLetter` carrying the reason and the raw bytes.
Old schema versions are upcast (:mod:`events.upcasting`) before validation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Union

import pydantic_core
from pydantic import Field, TypeAdapter, ValidationError

from events import catalog  # noqa: F401  (registers every event type)
from events.dead_letter import DeadLetter
from events.envelope import EventBase, event_classes
from events.upcasting import DOWNCASTERS, downcast, upcast

_CLASSES = event_classes()
#: types whose current version may be written as an older one (:mod:`events.upcasting`)
_DOWNCASTABLE = frozenset(
    cls for name, cls in _CLASSES.items() if (name, cls.SCHEMA_VERSION) in DOWNCASTERS
)

#: The discriminated union of every event type, tagged by ``type``.
Event = Annotated[Union[tuple(_CLASSES.values())], Field(discriminator="type")]  # noqa: UP007
EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)


def encode(event: EventBase) -> bytes:
    """The event's wire bytes (deterministic for equal events), at the oldest schema
    version that carries all of it (:func:`events.upcasting.downcast`: a record that
    needs no new field stays readable by consumers of earlier releases)."""
    if type(event) in _DOWNCASTABLE:
        raw = downcast(event.__pydantic_serializer__.to_python(event, mode="json"))
        return pydantic_core.to_json(raw, inf_nan_mode="constants")
    return event.__pydantic_serializer__.to_json(event)


def decode(raw: bytes) -> EventBase | DeadLetter:
    """The event in ``raw``, upcast to its current version, or a dead letter saying why."""
    try:
        return EVENT_ADAPTER.validate_json(raw)
    except ValidationError:
        pass  # diagnose below: the slow path is only for old or bad records
    return _decode_slow(raw)


def decode_or_raise(raw: bytes) -> EventBase:
    """Like :func:`decode` but raises ``ValueError`` with the dead letter's reason."""
    result = decode(raw)
    if isinstance(result, DeadLetter):
        raise ValueError(result.reason)
    return result


def _decode_slow(raw: bytes) -> EventBase | DeadLetter:
    try:
        obj = pydantic_core.from_json(raw, allow_inf_nan=True)
    except ValueError as exc:
        return DeadLetter(kind="malformed_json", reason=f"not valid JSON: {exc}", raw=raw)
    if not isinstance(obj, dict):
        return DeadLetter(
            kind="not_an_object",
            reason=f"expected a JSON object, got {type(obj).__name__}",
            raw=raw,
        )
    event_type = obj.get("type")
    if not isinstance(event_type, str):
        return DeadLetter(kind="missing_type", reason="no string 'type' field", raw=raw)
    cls = _CLASSES.get(event_type)
    if cls is None:
        return DeadLetter(
            kind="unknown_type",
            reason=f"unknown event type {event_type!r}",
            event_type=event_type,
            raw=raw,
        )
    version = obj.get("schema_version", 1)
    if isinstance(version, int) and version > cls.SCHEMA_VERSION:
        return DeadLetter(
            kind="future_schema_version",
            reason=(
                f"{event_type} schema_version {version} is newer than this build "
                f"supports (v{cls.SCHEMA_VERSION}); upgrade the consumer"
            ),
            event_type=event_type,
            raw=raw,
        )
    if isinstance(version, int) and version < cls.SCHEMA_VERSION:
        try:
            obj = upcast(obj, cls.SCHEMA_VERSION)
        except (LookupError, KeyError, TypeError, ValueError) as exc:
            return DeadLetter(
                kind="upcast_failed",
                reason=f"cannot upcast {event_type} v{version}: {exc}",
                event_type=event_type,
                raw=raw,
            )
    try:
        return EVENT_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or '<root>'}: {err['msg']}"
            for err in errors[:5]
        )
        return DeadLetter(
            kind="validation_error",
            reason=f"invalid {event_type}: {detail}",
            error_types=tuple(err["type"] for err in errors),
            event_type=event_type,
            raw=raw,
        )


def records_by_topic(
    events: Iterable[EventBase],
) -> dict[str, list[tuple[bytes | None, bytes]]]:
    """Events encoded as (key, value) records, grouped by topic, each group in the given
    order: what a backend's ``append_many`` takes."""
    by_topic: dict[str, list[tuple[bytes | None, bytes]]] = {}
    for ev in events:
        by_topic.setdefault(type(ev).TOPIC, []).append((ev.key(), encode(ev)))
    return by_topic


def topic_of(event: EventBase) -> str:
    """The topic an event belongs on."""
    return type(event).TOPIC
