"""Exactly once for retried pushes: the ``Idempotency-Key`` header and content dedupe.

A client whose push was cut off before its 200 cannot tell "not stored" from "stored,
answer lost", so it retries; before, each retry got fresh group ids and was served
again. With an ``Idempotency-Key`` header (the convention of payment APIs), a group's
identity is (key, index in the body), carried on its ``ScoredDataGroupStored``; the
batching fold queues an identity once within its window and reports a repeat as
``TrajectoryGroupDeduplicated``. The key is on the log, so every instance of the buffer,
and a restart after ``kill -9``, knows it. The ingress then answers a retry:

- key folded, every group of the body stored under it (the common retry): the first
  push's answer, rebuilt from what the fold kept, with ``Idempotent-Replayed: true``;
  nothing is appended;
- key folded with other payloads at the same indexes (or more groups than the body):
  422, the key was used for another body;
- the same key in flight on this instance (a retry that overtook its own first
  attempt): it waits for that attempt and answers what it answered (nothing appended),
  or, if that attempt failed, pushes itself;
- key not folded yet (in flight on another instance, or a push that reached the log in
  part before a kill): appended; the fold keeps the first of each identity and drops
  the rest (their payload records stay unreferenced until retention).

Content dedupe (``--dedupe-content``, off by default): each group's identity is also
the BLAKE2b-128 digest of its payload (the group exactly as ``/batch`` serves it); a
group byte-identical to one accepted within the window, or earlier in the same body, is
answered as a duplicate and not appended (``docs/trajectory-api.md`` says which real
repeats that drops).

Pure helpers here; the router wires them (:mod:`producers.trajectory_api.router`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

from producers.trajectory_api.models import AcceptedGroup

HEADER = "idempotency-key"
#: Longest key accepted (characters; Stripe's limit).
MAX_KEY_CHARS = 255
#: Default window: how many accepted groups later a push's key and digests are forgotten.
DEFAULT_WINDOW_GROUPS = 100_000


class PushedKey(Protocol):
    """What the fold kept of a key: its groups' payload CRC-32s by index (negative: that
    index never stored) and the buffered groups its answer reported."""

    @property
    def crcs(self) -> tuple[int, ...]: ...

    @property
    def buffered(self) -> int: ...

    @property
    def last_buffer(self) -> int: ...


def key_error(key: str) -> str | None:
    """Why ``key`` cannot be an idempotency key (None: it can)."""
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        return f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters"
    if not key.isascii() or not key.isprintable():
        return "Idempotency-Key must be printable ASCII"
    return None


def digest(payload: bytes) -> str:
    """The content identity of a group: BLAKE2b-128 of its payload, hex."""
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def answer(
    many: bool, groups: int, buffered: int = 0, last_buffer: int = -1, duplicates: int = 0
) -> dict[str, Any]:
    """The body of a push's 200, as the reference server words it (``duplicates``: groups
    content dedupe did not store)."""
    if many:
        out: dict[str, Any] = {"status": "received", "groups_processed": groups}
        if buffered:
            out["buffered"] = buffered
            out["last_buffer_size"] = last_buffer
        if duplicates:
            out["duplicates"] = duplicates
        return out
    if duplicates:
        return {"status": "duplicate"}
    if buffered:
        return {"status": "buffered", "buffer_size": last_buffer}
    return {"status": "received"}


def conflicts(crcs: Sequence[int], groups: Sequence[AcceptedGroup]) -> bool:
    """Whether a body cannot be a retry of the push that stored ``crcs``."""
    if len(crcs) > len(groups):
        return True
    return any(c >= 0 and c != g.crc for c, g in zip(crcs, groups, strict=False))


def complete(crcs: Sequence[int], groups: Sequence[AcceptedGroup]) -> bool:
    """Whether every group of the body is stored under the key already."""
    return len(crcs) == len(groups) and all(c >= 0 for c in crcs)


class InFlight:
    """Keyed pushes this instance is making durable: a retry with the same key waits for
    the first attempt instead of appending again (one event loop: no lock needed)."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[tuple[dict[str, Any], tuple[int, ...]] | None]] = {}
        #: requests waiting on another attempt of their key right now
        self.waiting = 0

    async def first(self, key: str) -> tuple[dict[str, Any], tuple[int, ...]] | None:
        """Wait out attempts with ``key`` in flight here; the (answer, CRC-32s) of the
        one that succeeded, or None when none is (left) in flight."""
        while (running := self._running.get(key)) is not None:
            self.waiting += 1
            try:
                done = await asyncio.shield(running)
            finally:
                self.waiting -= 1
            if done is not None:
                return done
        return None

    def begin(self, key: str) -> asyncio.Future[tuple[dict[str, Any], tuple[int, ...]] | None]:
        fut = asyncio.get_running_loop().create_future()
        self._running[key] = fut
        return fut

    def end(
        self,
        key: str,
        fut: asyncio.Future[tuple[dict[str, Any], tuple[int, ...]] | None],
        result: tuple[dict[str, Any], tuple[int, ...]] | None,
    ) -> None:
        """Finish an attempt: its answer and CRCs, or None (failed: a waiter pushes)."""
        if self._running.get(key) is fut:
            del self._running[key]
        if not fut.done():
            fut.set_result(result)

    def __len__(self) -> int:
        return len(self._running)
