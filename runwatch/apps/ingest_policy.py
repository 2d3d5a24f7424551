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
  trainer's, the processors'), whose ``seq`` accounting trusts;
- its text is bounded (:func:`text_over_cap`): a name field (:data:`NAME_FIELDS`: a
  usage phase, an eval split, a worker, an algorithm) at most :data:`MAX_NAME_CHARS`
  characters, every other string of its payload (a lifecycle ``reason``, a checkpoint path,
  a request or alert id, a config value or key, a sentinel) at most
  :data:`MAX_TEXT_CHARS`; a step's ``extra`` metrics are not judged (a logged array is
  kept there as JSON text, and no fold keeps a run's steps). Why: the folds keep a run's
  lifecycle facts (the run-state history, the view's transitions) and its phases, and
  rewrite them at every commit, so 400 KB reasons made one tenant's run a 100 MB document
  and every tenant's views lag by seconds (review finding 3). Such a record is refused,
  not cut: the gateway appends the bytes it was sent, and a runwatch hook never sends
  text this long (it cuts its own at 2,000 characters and says so,
  ``producers.hooks.obey.cut_text``), so only a client that is not one reaches it, and
  the dead letter names the field, its length and the cap.

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
from events.identity import HOOK_PRODUCER_PREFIX

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
LIFECYCLE_TOPIC = "runwatch.lifecycle"
#: The largest record a hook may publish (under a broker's default 1 MB message, as its
#: dead letter too): a step, a config, a checkpoint's file list are far below it.
MAX_RECORD_BYTES = 512 << 10
#: What the dead letter of an oversized record keeps of it.
KEPT_BYTES = 64 << 10
#: The longest string a hook event's payload may carry (a lifecycle reason, a checkpoint
#: path, a config value...): twice what a hook sends (it cuts at 2,000 characters), and
#: more than a Linux path (4,096 bytes) holds.
MAX_TEXT_CHARS = 4_096
#: The longest name (as long as a run id may be, ``events.identity``).
MAX_NAME_CHARS = 256
#: Payload fields that name something (kept per run apart: a phase is a column of the
#: run's bill), capped at :data:`MAX_NAME_CHARS`.
NAME_FIELDS = frozenset({"phase", "split", "worker", "algorithm"})
#: Payload fields not judged for text: a step's other metrics (not kept per run by any
#: fold; a logged array is JSON text there).
UNJUDGED_FIELDS = frozenset({"extra"})
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
    over = text_over_cap(event)
    if over is not None:
        field, length, cap = over
        why = (
            f"{kind}.{field} holds {length} characters, over the {cap} a hook may send "
            "(a runwatch hook cuts its text itself: upgrade it, or cut the text)"
        )
        return _refused(value, why, kind)
    return event


def text_over_cap(event: EventBase) -> tuple[str, int, int] | None:
    """The first payload string of ``event`` over its cap, as (field, its length in
    characters, the cap), or None. Strings inside a field of pairs (a config, sentinels,
    pins) count one by one, keys too (``config[<key>]``). The envelope's ids are bounded by
    the event model already."""
    for name in type(event).model_fields:
        if name in _ENVELOPE or name in UNJUDGED_FIELDS:
            continue
        cap = MAX_NAME_CHARS if name in NAME_FIELDS else MAX_TEXT_CHARS
        value = getattr(event, name)
        if isinstance(value, str):
            if len(value) > cap:
                return name, len(value), cap
        elif isinstance(value, tuple):
            for pair in value:
                if not isinstance(pair, tuple):
                    continue
                for text in pair:
                    if isinstance(text, str) and len(text) > cap:
                        return f"{name}[{str(pair[0])[:40]!r}]", len(text), cap
    return None


def readable(tenant_id: str, value: bytes) -> bool:
    """May ``tenant_id``'s hook read this record (of a :data:`READABLE_TOPICS` topic)?
    Only an event naming its tenant (a record that does not decode: no)."""
    event = decode_fast(value)
    return isinstance(event, EventBase) and event.tenant_id == tenant_id


_ENVELOPE = frozenset(EventBase.model_fields)


def _listed() -> str:
    return ", ".join(sorted(HOOK_EVENTS))
