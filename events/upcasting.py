"""Upcasters: old payload versions read as the current one; downcasters: a new version
written as the old one when it says nothing the old one cannot.

An upcaster maps the raw dict of ``(type, version)`` to the dict of ``version + 1``; the
codec chains them until the current version. Old records are never rewritten; they are
upcast every time they are read, so an auditor's export stays byte-identical.

A downcaster maps the raw dict of ``(type, version)`` to the dict of ``version - 1``, or
``None`` when the record uses what the older version lacks. The codec writes a record at
the oldest version that carries all of it, so a consumer of an earlier release (a
customer's training process on an older hook) keeps reading what it always read, and
only a record that needs the new field reaches it as a version it refuses. Writers that
send such a record must know the reader takes it (``RunPaused.refuses_stale_resume``
tells a resume's writer). A downcast record upcasts back to the equal event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
Downcaster = Callable[[dict[str, Any]], dict[str, Any] | None]

UPCASTERS: dict[tuple[str, int], Upcaster] = {}
DOWNCASTERS: dict[tuple[str, int], Downcaster] = {}


def _registrar(table: dict[tuple[str, int], Any], what: str, key: tuple[str, int]) -> Any:
    def register(fn: Any) -> Any:
        if key in table:
            raise ValueError(f"{what} for {key} registered twice")
        table[key] = fn
        return fn

    return register


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` as the upcaster of ``event_type`` from ``from_version``."""
    return _registrar(UPCASTERS, "upcaster", (event_type, from_version))


def downcaster(event_type: str, from_version: int) -> Callable[[Downcaster], Downcaster]:
    """Register ``fn`` as the downcaster of ``event_type`` from ``from_version`` to the
    version before it (``fn`` returns ``None`` when the record cannot be written so)."""
    return _registrar(DOWNCASTERS, "downcaster", (event_type, from_version))


def downcast(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` at the oldest version that carries all of it (chaining downcasters from
    ``raw['schema_version']`` while each one can); ``raw`` itself when none can."""
    event_type = raw["type"]
    version = int(raw.get("schema_version", 1))
    while (fn := DOWNCASTERS.get((event_type, version))) is not None:
        older = fn(dict(raw))
        if older is None:
            break
        version -= 1
        older["schema_version"] = version
        raw = older
    return raw


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


@upcaster("RunPaused", 3)
def _paused_v3_to_v4(raw: dict[str, Any]) -> dict[str, Any]:
    """v3's writer did not say it refuses a stale resume: ``refuses_stale_resume`` is
    False (send it v1 resumes only)."""
    _not_yet(raw, ("refuses_stale_resume",))
    raw["refuses_stale_resume"] = False
    return raw


@downcaster("RunPaused", 4)
def _paused_v4_to_v3(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A pause whose process does not refuse stale resumes says nothing v3 cannot."""
    if raw.pop("refuses_stale_resume", False):
        return None
    return raw


@upcaster("UnpauseRequested", 1)
def _unpause_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 did not name the pause it answers: ``answers`` is "" (the pause in effect,
    whichever it is, as v1 consumers took it); a v1 record carrying it is refused."""
    _not_yet(raw, ("answers",))
    raw["answers"] = ""
    return raw


@downcaster("UnpauseRequested", 2)
def _unpause_v2_to_v1(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A resume naming no pause is a v1 resume (what trainers and hooks of earlier
    releases read; they dead-letter a v2 one)."""
    if raw.pop("answers", ""):
        return None
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
