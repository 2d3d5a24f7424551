"""Which tenant a run belongs to, in a host: a run id is its first tenant's.

A customer's producer names its run id and tenant (the hooks), so another tenant can name a
run id that is already taken — by accident (two customers' ``exp-1``) or to page and
pause someone else's run. A host pins each run to the tenant of the first event of it that
it folds, for all its folds that claim runs together (:func:`group_pins`: the run's own
topics, and the traces apart), and refuses another tenant's events on the id:
never folded, dead-lettered as ``foreign_tenant`` with both tenants in the reason and the
record's bytes (docs/threat-model.md, "Producers on the data plane").

- :class:`RunPins`: run id -> tenant for a host's folds that claim runs together (the
  embedded host and the replay: :func:`group_pins`, one per co-partitioned group, as
  faust; a faust agent: ``faust_agent.agent_pins``). The pins persist
  in the folds' slots (``Slot.tenant``, :mod:`runwatch.hosting.core`): after a restart
  ``lookup`` finds them there. Commands (:data:`UNPINNING`) never pin a run: anyone may
  ask about any run id (a customer's refused command is written under the customer's
  tenant, an unknown run's under none), and the run's own facts must claim it.
- :func:`foreign_owner`: the same check on one slot, for the hosts of one fold (the
  notifier, the trajectory tail); it also pins a slot stored before slots held tenants.
- :func:`foreign_letter`: the dead letter of a refused event.

Time: nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from events.codec import encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase


class Pinned(Protocol):
    """What holds a run's tenant (a host's slot)."""

    tenant: str | None


#: Topics whose events never claim a run: the commands (and their refusals).
UNPINNING = frozenset({"runwatch.control"})


class RunPins:
    """Run id -> the tenant it belongs to, for one host. ``lookup(run_id)``: the tenant a
    stored slot of the run was pinned to, or None (a run this host has not seen)."""

    __slots__ = ("by_run", "lookup")

    def __init__(self, lookup: Callable[[str], str | None]) -> None:
        #: the pins known so far (hosts read it directly: one dict lookup per event)
        self.by_run: dict[str, str] = {}
        self.lookup = lookup

    def owner_of(self, event: EventBase, topic: str) -> str:
        """The tenant ``event``'s run belongs to. A run not pinned yet is pinned to
        ``event``'s tenant, unless ``topic`` is a command topic: then the event is
        taken as it is, and the run stays unpinned."""
        run = event.run_id
        owner = self.by_run.get(run)
        if owner is None:
            owner = self.lookup(run)
            if owner is None and topic in UNPINNING:
                return event.tenant_id
            owner = self.by_run[run] = owner or event.tenant_id
        return owner


def group_pins(folds: Iterable[Any]) -> dict[str, RunPins]:
    """The run pins of a host's hosted folds (:class:`~runwatch.hosting.core.HostedFold`),
    by topic: one :class:`RunPins` per group of deduplicating folds whose inputs have the
    same partition counts — the groups the faust topology makes one agent (and one set of
    pins) each (:func:`runwatch.hosting.faust_topology.build_topology`), so the embedded
    host and faust claim a run alike.

    For the processors that is the run's own topics (lifecycle, telemetry, alerts, rewards,
    checkpoints, control) together, which are what the read model reads too, and the
    rollout traces (profiling) apart: a tenant whose traces name a run id first claims it
    for profiling only. (Before 2026-11-27 the embedded host pinned on traces too: another
    tenant's traces imported first took a run's bills and gates from it — every usage fact
    and step refused — while the read model, which reads no traces, showed its spend.)"""
    groups: dict[frozenset[int | None], list[Any]] = {}
    for hf in folds:
        if hf.dedupe:
            counts = frozenset(_partitions(t) for t in hf.fold.inputs)
            groups.setdefault(counts, []).append(hf)
    out: dict[str, RunPins] = {}
    for members in groups.values():
        pins = slot_pins(members)
        for hf in members:
            for topic in hf.fold.inputs:
                out[topic] = pins
    return out


def _partitions(topic: str) -> int | None:
    from events.topics import TOPICS

    known = TOPICS.get(topic)
    return known.partitions if known is not None else None


def slot_pins(folds: Iterable[Any]) -> RunPins:
    """The run pins of hosted folds (:class:`~runwatch.hosting.core.HostedFold`) that claim
    runs together: a stored pin is the tenant of any deduplicating fold's slot of the run."""
    hosted = [hf for hf in folds if hf.dedupe]

    def pinned(run: str) -> str | None:
        for hf in hosted:
            slot = hf.slots.get(run)
            if slot is not None and slot.tenant is not None:
                return str(slot.tenant)
        return None

    return RunPins(pinned)


def foreign_owner(slot: Pinned, event: EventBase) -> str | None:
    """The tenant that owns ``slot``'s run when ``event`` names another one (the event must
    then not be folded); ``None`` when the event's tenant owns it (an unpinned slot is
    pinned to it here)."""
    owner = slot.tenant
    if owner == event.tenant_id:
        return None
    if owner is None:
        slot.tenant = event.tenant_id
        return None
    return owner


#: What a ``fold_failed`` letter's reason says after the fold's name.
FOLD_FAILED_SAYS = " could not fold this "


def fold_failed_letter(
    event: EventBase,
    fold: str,
    exc: BaseException,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> DeadLetter:
    """The dead letter of an event fold ``fold`` raised on: kept with its reason, not
    folded there (the host goes on with the fold's state as it was before it)."""
    why = f"{fold}{FOLD_FAILED_SAYS}{event.type}: {type(exc).__name__}: {exc}"[:2000]
    return _event_letter(event, "fold_failed", why, topic, partition, offset)


def failed_fold(letter: DeadLetter) -> str:
    """The fold a ``fold_failed`` letter of :func:`fold_failed_letter` names (its reason
    begins with it). Assumption: no fold's name holds :data:`FOLD_FAILED_SAYS`."""
    return letter.reason.partition(FOLD_FAILED_SAYS)[0]


def foreign_letter(
    event: EventBase,
    owner: str,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> DeadLetter:
    """The dead letter of an event refused because its run id belongs to ``owner``."""
    why = (
        f"run {event.run_id!r} belongs to tenant {owner!r}; this {event.type} names "
        f"tenant {event.tenant_id!r}: refused, not folded (a run id is its first tenant's)"
    )
    return _event_letter(event, "foreign_tenant", why, topic, partition, offset)


def _event_letter(
    event: EventBase,
    kind: Any,
    reason: str,
    topic: str | None,
    partition: int | None,
    offset: int | None,
) -> DeadLetter:
    """A valid event's dead letter: its bytes, type and place, with ``kind`` and why."""
    return DeadLetter(
        kind=kind,
        reason=reason,
        event_type=event.type,
        raw=encode(event),
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
    )
