"""The audit: replay a log up to the positions a live read model consumed, and compare.

:func:`verify` replays an embedded log from scratch *up to the positions* a durable read
model says it has consumed and returns the first difference between the two (or None):
``runwatch audit verify`` prints it. :func:`verify_backend` does the same over any log
backend (Kafka). The comparison is of the whole exported projection (runs, series, fleet,
tenant totals), depth first with keys sorted (:func:`first_difference`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from events.log.base import LogBackend
from runwatch.hosting.replay import ReplayResult, rebuild_from_backend, rebuild_from_log
from runwatch.hosting.result import Positions


def first_difference(a: Any, b: Any, path: str = "$") -> tuple[str, Any, Any] | None:
    """The first place (depth-first, keys sorted) where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}", a.get(key, "<missing>"), b.get(key, "<missing>")
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}.length", len(a), len(b)
        return None
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return None  # NaN == NaN for the audit
    return None if a == b else (path, a, b)


@dataclass
class Verification:
    difference: tuple[str, Any, Any] | None
    positions: Positions
    replay: ReplayResult

    @property
    def identical(self) -> bool:
        return self.difference is None


def verify(
    live: Any,
    log: str | os.PathLike[str] | Any,
    *,
    policy: Any = None,
    prices: Any = None,
    workers: int = 1,
) -> Verification:
    """Replay ``log`` from scratch up to ``live``'s consumed positions and compare.
    ``workers`` > 1: a key-sharded replay, unless the live projection still holds runs at
    the terminal barrier (the replay must hold them too: one process, no forced release)."""
    snapshot = live.load()
    positions = snapshot.positions
    still_held = bool((snapshot.held or {}).get("runs"))
    replay = rebuild_from_log(
        log,
        policy=policy,
        prices=prices,
        until=positions,
        force_release=not still_held,
        collect=False,
        workers=1 if still_held else workers,
    )
    return Verification(first_difference(live.export(), replay.store.export()), positions, replay)


async def verify_backend(
    live: Any,
    backend: LogBackend,
    *,
    policy: Any = None,
    prices: Any = None,
) -> Verification:
    """:func:`verify` for a projection fed from Kafka (or any backend): replay the
    backend's topics from offset 0 up to ``live``'s positions and compare."""
    snapshot = live.load()
    still_held = bool((snapshot.held or {}).get("runs"))
    replay = await rebuild_from_backend(
        backend,
        policy=policy,
        prices=prices,
        until=snapshot.positions,
        force_release=not still_held,
    )
    difference = first_difference(live.export(), replay.store.export())
    return Verification(difference, snapshot.positions, replay)
