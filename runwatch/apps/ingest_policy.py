"""What a tenant's hook may write and read through the ingest gateway (pure; no I/O).

A live hook runs inside the customer's own training process (TRL, verl, a plain loop), so
what it sends is tenant input. Written straight to the shared topics, it could name any
tenant (Kafka does not stamp the producing principal) and any event type: bill another
tenant, fire alerts, forge state changes, command runs. Behind the gateway
(:mod:`runwatch.apps.ingest_app`) the caller's API key names its tenant, and each record is
judged here before it reaches a topic:

- it is at most :data:`MAX_RECORD_BYTES` and decodes as an event (else the codec's own
  dead letter);
- its type is one a hook publishes (:data:`HOOK_EVENTS`: a run's lifecycle as its
  process sees it, its steps, timings, rollouts, evals, usage, checkpoints), on that
  type's topic, keyed by its run id;
- it names the caller's tenant (else ``foreign_tenant``), and a run of the tenant's own:
  ``<tenant>:<name>`` (:data:`RUN_SEPARATOR`). Run ids are what every host keys a run's
  state by, and a run id is its first tenant's (``runwatch.hosting.tenancy``): with any
  name allowed, two customers' ``exp-1`` were one run — the second one's every event
  refused, its run unmonitored and unbilled — and a tenant who guessed another's next
  run name could take it first;
- its producer is a hook's (``hook/...``), never one of the platform's own names (the
  trainer's, the processors'), whose ``seq`` accounting trusts.

A refused record becomes a dead letter with the reason (the gateway writes it to the
dead-letter topic: nothing is lost, and nothing reaches the run). What a hook reads back is
its own tenant's commands and lifecycle facts, nothing else (:func:`readable`).

Assumptions: the key's tenant is the truth (the keys file, :mod:`projections.keys`);
operator keys neither write nor read here (an operator commands runs through the query
API). A run id first claimed by another tenant (a platform producer's, say) is the
hosts' to refuse (``foreign_tenant`` at the processors' tenancy pins), as for any producer.
"""

from __future__ import annotations

from events.catalog.control import CONTROL_TOPIC
from events.codec import decode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fast_decode import decode_fast

#: The event types a hook publishes (``producers.hooks``: hook, obey, mapping).
HOOK_EVENTS = frozenset(
    {
        "RunSubmitted",
        "RunStarted",
        "RunResumed",
        "RunPaused",
        "RunCancelled",
        "RunCompleted",
        "RunFailed",
        "TrainerStepCompleted",
        "StepPhaseTimed",
        "RolloutBatchCompleted",
        "EvalGateScored",
        "UsageRecorded",
        "CheckpointWritten",
    }
)
#: Between a tenant and its own name for a run: a hooked run's id is ``<tenant>:<name>``
#: (``producers.hooks.hook.tenant_run_id``, whose ``TENANT_SEPARATOR`` must be this one; a
#: tenant id holds no ``:``, ``projections.keys``).
RUN_SEPARATOR = ":"
#: Every producer name a hook writes under begins so (``RunwatchHook``'s default).
HOOK_PRODUCER_PREFIX = "hook/"
LIFECYCLE_TOPIC = "runwatch.lifecycle"
#: The largest record a hook may publish (under a broker's default 1 MB message, as its
#: dead letter too): a step, a config, a checkpoint's file list are far below it.
MAX_RECORD_BYTES = 512 << 10
#: What the dead letter of an oversized record keeps of it.
KEPT_BYTES = 64 << 10
#: The topics a hook reads back: its run's commands, and its run's lifecycle (to resume
#: paused, or stop when cancelled, after a restart).
READABLE_TOPICS = frozenset({CONTROL_TOPIC, LIFECYCLE_TOPIC})


def _refused(raw: bytes, reason: str, event_type: str | None, kind: str = "refused_at_ingest"):
    return DeadLetter(kind=kind, reason=reason, event_type=event_type, raw=raw)  # type: ignore[arg-type]


def admit(tenant_id: str, topic: str, key: bytes | None, value: bytes) -> EventBase | DeadLetter:
    """The event a record of ``tenant_id``'s hook carries to ``topic``, or why not."""
    if len(value) > MAX_RECORD_BYTES:
        why = (
            f"a record of {len(value)} bytes is over the {MAX_RECORD_BYTES} a hook may "
            f"publish (this dead letter keeps its first {KEPT_BYTES})"
        )
        return _refused(value[:KEPT_BYTES], why, None)
    event = decode(value)
    if isinstance(event, DeadLetter):
        return event
    kind = event.type
    if kind not in HOOK_EVENTS:
        return _refused(value, f"a hook may not publish {kind} (only {_listed()})", kind)
    if topic != type(event).TOPIC:
        return _refused(value, f"{kind} belongs on {type(event).TOPIC}, not {topic}", kind)
    if event.tenant_id != tenant_id:
        why = f"the API key is tenant {tenant_id!r}'s; the event names {event.tenant_id!r}"
        return _refused(value, why, kind, kind="foreign_tenant")
    if not event.run_id.startswith(f"{tenant_id}{RUN_SEPARATOR}"):
        why = (
            f"behind the gateway a run id is its tenant's, {tenant_id}{RUN_SEPARATOR}<name>, "
            f"not {event.run_id[:100]!r} (so no other tenant can take it; a hook from "
            "before 2026-11-28 names it without: upgrade it)"
        )
        return _refused(value, why, kind)
    if not event.producer.startswith(HOOK_PRODUCER_PREFIX):
        why = f"producer {event.producer!r} is not a hook's ({HOOK_PRODUCER_PREFIX}...)"
        return _refused(value, why, kind)
    if key != event.key():
        return _refused(value, f"a {kind} is keyed by its run id {event.run_id!r}", kind)
    return event


def readable(tenant_id: str, value: bytes) -> bool:
    """May ``tenant_id``'s hook read this record (of a :data:`READABLE_TOPICS` topic)?
    Only an event naming its tenant (a record that does not decode: no)."""
    event = decode_fast(value)
    return isinstance(event, EventBase) and event.tenant_id == tenant_id


def _listed() -> str:
    return ", ".join(sorted(HOOK_EVENTS))
