"""Upcasters: old payload versions read as the current one.

An upcaster maps the raw dict of ``(type, version)`` to the dict of ``version + 1``; the
codec chains them until the current version. Old records are never rewritten; they are
upcast every time they are read, so an auditor's export stays byte-identical.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


def _not_yet(raw: dict[str, Any], names: Iterable[str]) -> None:
    """A record of an older version carrying a field that version did not have is not a
    record of that version: ``ValueError`` (the codec dead-letters it, ``upcast_failed``),
    never a silent merge into the newer one."""
    found = sorted(n for n in names if n in raw)
    if found:
        raise ValueError(
            f"{raw.get('type')} v{raw.get('schema_version', 1)} has no field {', '.join(found)}"
        )


@upcaster("UsageRecorded", 2)
def _usage_v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """v2 billed ``gpu_seconds``: they become ``device_seconds`` with ``device_kind``
    "gpu" (what v2 said it metered, whatever the host really had). A v2 record without
    ``gpu_seconds`` stays without ``device_seconds`` (a dead letter, as it was in v2)."""
    _not_yet(raw, ("device_seconds", "device_kind"))
    if "gpu_seconds" in raw:
        raw["device_seconds"] = raw.pop("gpu_seconds")
    raw["device_kind"] = "gpu"
    return raw


@upcaster("TenantUsageUpdated", 1)
def _tenant_usage_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 billed every device-second as a GPU-second: ``device_seconds_by_kind`` is the
    v1 total over ``gpu_seconds_by_pool`` under "gpu" (empty when there was none)."""
    _not_yet(raw, ("device_seconds_by_kind",))
    pools = raw.get("gpu_seconds_by_pool") or ()
    items = pools.items() if isinstance(pools, dict) else pools
    total = sum(float(v) for _k, v in items)
    raw["device_seconds_by_kind"] = {"gpu": total} if items else {}
    return raw


@upcaster("RolloutBatchCompleted", 1)
def _rollout_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 carried no engine telemetry and no rollout-vs-train mismatch: every new field is
    null (not measured)."""
    _not_yet(raw, ROLLOUT_V2_FIELDS)
    for name in ROLLOUT_V2_FIELDS:
        raw[name] = None
    return raw


@upcaster("ResumeCertified", 1)
def _certified_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 did not name the rollout engine the replay ran on: ``rollout_engine`` is null."""
    _not_yet(raw, ("rollout_engine",))
    raw["rollout_engine"] = None
    return raw


#: The fields RolloutBatchCompleted v2 added (all optional).
ROLLOUT_V2_FIELDS = (
    "engine_steps",
    "engine_busy_s",
    "tokens_per_s",
    "queue_depth_max",
    "queue_depth_mean",
    "running_max",
    "kv_cache_usage_max",
    "preemptions",
    "logprob_abs_diff_mean",
    "logprob_abs_diff_max",
    "importance_weight_mean",
    "importance_weight_min",
    "importance_weight_max",
)


@upcaster("RunPaused", 1)
def _paused_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 named neither the pause checkpoint nor the request it answered: ``checkpoint``
    and ``request_id`` are set to "" when absent."""
    raw.setdefault("checkpoint", "")
    raw.setdefault("request_id", "")
    return raw


@upcaster("RunPaused", 2)
def _paused_v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """v2 named the request it answered but not who made it nor for which alert:
    ``requested_by`` and ``alert_id`` are "" (unknown)."""
    _not_yet(raw, ("requested_by", "alert_id"))
    raw["requested_by"] = ""
    raw["alert_id"] = ""
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
