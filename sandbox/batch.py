"""The host-side input contract: what a caller's batch must be to cross the boundary. Pure.

A batch is sent to the worker as JSON (``sandbox.protocol.encode_frame``: strict, no
NaN/Infinity). :func:`validate_batch` checks the *whole* batch before anything is sent, so
a batch the platform cannot encode is refused as the caller's ``bad_input`` — never sent
half-way, never mistaken for a dead worker (``tenant_crash``), never silently dropped:

- a non-empty list of at most ``max_items`` dicts;
- every item has ``prompt`` and ``completion`` as ``str``; further fields are allowed;
- every value, at every depth (at most :data:`MAX_DEPTH`), is JSON as the worker will see
  it: ``None``, ``bool``, ``int``, a *finite* ``float``, ``str``, a list/tuple, or a dict
  with ``str`` keys (``json`` would turn other keys into strings, and two keys into one);
- every string is valid Unicode text (no lone surrogates: they cannot be UTF-8);
- the encoded batch is at most ``max_bytes`` (it must fit the worker's memory as well as
  the frame).

It returns ``""`` for a valid batch, else the first problem with its path
(``batch[3].meta.score: NaN is not JSON``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Items per batch.
MAX_ITEMS = 65_536
#: Encoded size of one batch (the client also caps it at 1/16 of the worker's memory).
MAX_BATCH_BYTES = 16 * 1024 * 1024
#: Nesting of containers inside one item.
MAX_DEPTH = 32

_SURROGATE = re.compile("[\ud800-\udfff]")


def validate_batch(
    batch: Any, *, max_items: int = MAX_ITEMS, max_bytes: int = MAX_BATCH_BYTES
) -> str:
    """``""`` if ``batch`` can cross the boundary, else why not (see the module docstring).

    Cheap on the hot path: string fields are only type-checked here (their text is checked
    in one pass over the encoded batch), other values are walked."""
    if not isinstance(batch, list) or not batch:
        return "batch must be a non-empty list of dicts"
    if len(batch) > max_items:
        return f"batch has {len(batch)} items > {max_items}"
    for i, item in enumerate(batch):
        if not isinstance(item, dict):
            return f"batch[{i}] is not a dict"
        for key in ("prompt", "completion"):
            if not isinstance(item.get(key), str):
                return f"batch[{i}].{key} missing or not a string"
        for k, v in item.items():
            if type(k) is not str:
                return f"batch[{i}]: key {k!r} is not a string"
            if type(v) is not str:
                bad = _json_problem(v, f"batch[{i}].{k[:40]}", 1)
                if bad:
                    return bad
    try:
        text = json.dumps(batch, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))  # a lone surrogate cannot be UTF-8: raises
    except UnicodeEncodeError:
        return _first_surrogate(batch)
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        return f"batch is not JSON-encodable: {type(exc).__name__}: {exc}"[:300]
    if size > max_bytes:
        return f"batch encodes to {size} bytes > {max_bytes}"
    return ""


def _first_surrogate(batch: list[dict[str, Any]]) -> str:
    """Where the first lone surrogate is (the slow path of a refused batch)."""
    for i, item in enumerate(batch):
        for k, v in item.items():
            if _has_surrogate(k):
                return f"batch[{i}]: a key is not valid Unicode text (a lone surrogate)"
            bad = _json_problem(v, f"batch[{i}].{k[:40]}", 1)
            if bad:
                return bad
    return "batch is not valid Unicode text (a lone surrogate)"


def _json_problem(value: Any, path: str, depth: int) -> str:
    if value is None or isinstance(value, bool):
        return ""
    if isinstance(value, str):
        return f"{path}: not valid Unicode text (a lone surrogate)" if _has_surrogate(value) else ""
    if isinstance(value, int):
        if value.bit_length() > 13_000:  # near int -> str conversion's 4300-digit limit
            try:
                json.dumps(value)
            except ValueError:
                return f"{path}: integer too large to encode"
        return ""
    if isinstance(value, float):
        return "" if math.isfinite(value) else f"{path}: {value!r} is not JSON (NaN/Infinity)"
    if depth > MAX_DEPTH:
        return f"{path}: nested deeper than {MAX_DEPTH}"
    if isinstance(value, (list, tuple)):
        for j, v in enumerate(value):
            bad = _json_problem(v, f"{path}[{j}]", depth + 1)
            if bad:
                return bad
        return ""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path}: key {k!r} is not a string"
            if _has_surrogate(k):
                return f"{path}: a key is not valid Unicode text (a lone surrogate)"
            bad = _json_problem(v, f"{path}.{k[:40]}", depth + 1)
            if bad:
                return bad
        return ""
    return f"{path}: {type(value).__name__} is not JSON-encodable"


def _has_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None
