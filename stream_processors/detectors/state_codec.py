"""Folded detector state <-> bytes (msgpack), for hosts that persist per-run state.

Records (NamedTuples and frozen dataclasses registered with
:func:`~stream_processors.detectors.base.state_type`) are written as
``{"@": name, "v": [fields...]}``; tuples as arrays (read back as tuples); floats as
binary doubles (NaN and infinities included, bit-exact). msgpack because the faust host
writes a run's state to its changelog for every event: a JSON float repr costs more than
the fold itself.
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
    return cls(*obj["v"])


def dump(state: Any) -> bytes:
    return msgpack.packb(state, default=_default, strict_types=True, use_bin_type=True)


def load(raw: bytes) -> Any:
    return msgpack.unpackb(
        raw, list_hook=tuple, object_hook=_record, raw=False, strict_map_key=False
    )
