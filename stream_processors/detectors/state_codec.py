"""Folded detector state <-> bytes (msgpack), for hosts that persist per-run state.

Records (NamedTuples and frozen dataclasses registered with
:func:`~stream_processors.detectors.base.state_type`) are written as
``{"@": name, "v": [fields...]}``; tuples as arrays (read back as tuples); floats as
binary doubles (NaN and infinities included, bit-exact). msgpack because the faust host
writes a run's state to its changelog for every event: a JSON float repr costs more than
the fold itself.

Layout changes: a record stored with another number of fields than its class has now
(the detector's state changed shape between versions) loads as the class's fresh state,
or as what its ``from_stale(fields)`` class method keeps of it; so a change of a state's
layout must change its field count (or its class name), never only the fields' meaning.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from stream_processors.detectors.base import STATE_TYPES


def _default(obj: Any) -> Any:
    cls = type(obj)
    if cls is tuple:
        return list(obj)
    if isinstance(obj, tuple) and hasattr(cls, "_fields"):
        return {"@": cls.__name__, "v": list(obj)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"@": cls.__name__, "v": [getattr(obj, f.name) for f in dataclasses.fields(obj)]}
    raise TypeError(f"cannot persist {cls.__name__} in detector state")


def _record(obj: dict[str, Any]) -> Any:
    name = obj.get("@")
    if name is None:
        return obj
    try:
        cls = STATE_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown state record {name!r}") from None
    fields = obj["v"]
    if len(fields) != _arity(cls):
        # stored by a version of the detector whose state had another layout: that
        # detector starts afresh (its class may keep what still means the same, e.g. an
        # open episode) instead of the host failing on every record of the run
        stale = getattr(cls, "from_stale", None)
        return stale(tuple(fields)) if stale is not None else cls()
    return cls(*fields)


def _arity(cls: type) -> int:
    """The number of fields a record of ``cls`` is stored with."""
    found = _ARITY.get(cls)
    if found is None:
        fields = getattr(cls, "_fields", None)
        found = len(fields) if fields is not None else len(dataclasses.fields(cls))  # type: ignore[arg-type]
        _ARITY[cls] = found
    return found


_ARITY: dict[type, int] = {}


def dump(state: Any) -> bytes:
    return msgpack.packb(state, default=_default, strict_types=True, use_bin_type=True)


def load(raw: bytes) -> Any:
    return msgpack.unpackb(
        raw, list_hook=tuple, object_hook=_record, raw=False, strict_map_key=False
    )
