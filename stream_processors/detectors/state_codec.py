"""Folded detector state <-> bytes (JSON), for hosts that persist per-run state.

Records (NamedTuples and frozen dataclasses registered with
:func:`~stream_processors.detectors.base.state_type`) are written as
``{"@": name, "v": [fields...]}``; tuples as arrays (read back as tuples); NaN and
infinities as the JSON constants. Loading a record whose class gained fields since it was
dumped fills the new fields with their defaults.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from stream_processors.detectors.base import STATE_TYPES


def _enc(obj: Any) -> Any:
    if isinstance(obj, tuple):
        if hasattr(obj, "_fields"):
            return {"@": type(obj).__name__, "v": [_enc(x) for x in obj]}
        return [_enc(x) for x in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = [_enc(getattr(obj, f.name)) for f in dataclasses.fields(obj)]
        return {"@": type(obj).__name__, "v": values}
    return obj


def _dec(obj: Any) -> Any:
    if isinstance(obj, list):
        return tuple(_dec(x) for x in obj)
    if isinstance(obj, dict):
        try:
            cls = STATE_TYPES[obj["@"]]
        except KeyError:
            raise ValueError(f"unknown state record {obj.get('@')!r}") from None
        return cls(*(_dec(x) for x in obj["v"]))
    return obj


def dump(state: Any) -> bytes:
    return json.dumps(_enc(state), separators=(",", ":"), allow_nan=True).encode()


def load(raw: bytes) -> Any:
    return _dec(json.loads(raw))
