"""Upcasters: old payload versions read as the current one.

An upcaster maps the raw dict of ``(type, version)`` to the dict of ``version + 1``; the
codec chains them until the current version. Old records are never rewritten; they are
upcast every time they are read, so an auditor's export stays byte-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` as the upcaster of ``event_type`` from ``from_version``."""

    def register(fn: Upcaster) -> Upcaster:
        key = (event_type, from_version)
        if key in UPCASTERS:
            raise ValueError(f"upcaster for {key} registered twice")
        UPCASTERS[key] = fn
        return fn

    return register


def upcast(raw: dict[str, Any], current: int) -> dict[str, Any]:
    """Chain upcasters from ``raw['schema_version']`` to ``current``.

    Raises ``LookupError`` when a step of the chain is missing.
    """
    event_type = raw["type"]
    version = int(raw.get("schema_version", 1))
    while version < current:
        fn = UPCASTERS.get((event_type, version))
        if fn is None:
            raise LookupError(f"no upcaster for {event_type} v{version} -> v{version + 1}")
        raw = fn(dict(raw))
        version += 1
        raw["schema_version"] = version
    return raw


@upcaster("UsageRecorded", 1)
def _usage_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 had no pool: ``pool`` is set to "rollout_fleet" when ``phase`` is "rollout" (rollout
    generation ran on the rollout fleet), else to "trainer"."""
    raw["pool"] = "rollout_fleet" if raw.get("phase") == "rollout" else "trainer"
    return raw


@upcaster("RunPaused", 1)
def _paused_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 named neither the pause checkpoint nor the request it answered: ``checkpoint``
    and ``request_id`` are set to "" when absent."""
    raw.setdefault("checkpoint", "")
    raw.setdefault("request_id", "")
    return raw


@upcaster("RunResumed", 1)
def _resumed_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 named neither the checkpoint resumed from, the request answered nor a rollback:
    ``checkpoint`` and ``request_id`` are set to "" and ``rolled_back_to`` to null when
    absent."""
    raw.setdefault("checkpoint", "")
    raw.setdefault("request_id", "")
    raw.setdefault("rolled_back_to", None)
    return raw


@upcaster("RunCancelled", 1)
def _cancelled_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 did not name the request it answered: ``request_id`` is set to "" when absent."""
    raw.setdefault("request_id", "")
    return raw


@upcaster("ScoredDataGroupStored", 1)
def _stored_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 carried no push identity: no key, no digest, nothing for the fold to remember."""
    raw.setdefault("idempotency_key", None)
    raw.setdefault("key_index", 0)
    raw.setdefault("content_digest", None)
    raw.setdefault("dedupe_window", 0)
    return raw
