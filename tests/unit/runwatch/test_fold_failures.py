"""A fold that raises on one event stops nothing else (found by review: one tenant's
record a processor could not handle stopped every tenant's processors, on every start).

The event is dead-lettered (``fold_failed``, with the fold and the error) and not folded
by that fold; its other folds, and every later record, go on. Pure logic, no broker: the
embedded host's core and the faust agent's record handler on dict tables, which must
agree.
"""

from __future__ import annotations

from typing import Any

from events import AlertFired, PauseRequested, TenantUsageUpdated
from events.codec import encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from runwatch.folds import processor_folds
from runwatch.hosting.faust_agent import SlotCache, agent_pins, fold_records
from runwatch.hosting.host import Host
from runwatch.hosting.stores import NoState
from stream_processors.detectors.scenarios import synthetic_run
from tests.event_samples import forged_steps

RUN, POISON = "run-a", 13


class Poisoned:
    """A fold as it was, except that it raises on the events of step :data:`POISON`
    (``at="apply"``) or cannot store what it made of them (``at="dump"``)."""

    def __init__(self, inner: Any, at: str = "apply") -> None:
        self.inner, self.at, self.bad = inner, at, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def apply(self, state: Any, event: EventBase) -> Any:
        if event.step == POISON and event.type == "TrainerStepCompleted":
            if self.at == "apply":
                raise ValueError("cannot fold this")
            self.bad = True
        return self.inner.apply(state, event)

    def dump_state(self, state: Any) -> bytes:
        if self.bad:
            self.bad = False
            raise TypeError("cannot persist int in detector state")
        return self.inner.dump_state(state)


def _events() -> list[EventBase]:
    """A healthy run, then three steps whose reward explodes: a page and a pause."""
    run = synthetic_run(7, steps=80, run_id=RUN, tenant_id="acme")
    return [*run, *forged_steps(run, RUN, "acme", 3)]


def _folds(at: str | None) -> list[Any]:
    folds = processor_folds()
    return [Poisoned(f, at) if f.name == "run-health" and at else f for f in folds]


def _host_run(at: str | None) -> tuple[Host, list[EventBase]]:
    host = Host(_folds(at), NoState())
    out: list[EventBase] = []
    batch = _events()
    while batch:
        derived = host.process_events((type(e).TOPIC, 0, e) for e in batch)
        out.extend(derived)
        batch = derived
    return host, out


def _kinds(out: list[EventBase]) -> set[str]:
    return {e.type for e in out if isinstance(e, AlertFired | PauseRequested)}


def test_the_embedded_host_dead_letters_the_event_and_goes_on() -> None:
    _, clean = _host_run(None)
    assert {"AlertFired", "PauseRequested"} <= _kinds(clean)  # the control: it pages
    host, out = _host_run("apply")
    (letter,) = host.dead_letters
    assert letter.kind == "fold_failed" and letter.event_type == "TrainerStepCompleted"
    assert "run-health" in letter.reason and "ValueError: cannot fold this" in letter.reason
    assert host.fold_failures == 1
    assert _kinds(out) == _kinds(clean)  # later steps still page and pause the run
    bills = [e for e in out if isinstance(e, TenantUsageUpdated)]
    assert len(bills) == len([e for e in clean if isinstance(e, TenantUsageUpdated)])


def _faust_run(at: str | None) -> tuple[list[DeadLetter], list[bytes]]:
    folds = _folds(at)
    hosted = {f.name: (f, {}, SlotCache()) for f in folds}
    owners = agent_pins(list(hosted.values()))
    letters: list[DeadLetter] = []
    sent: list[bytes] = []
    queue = [(type(e).TOPIC, encode(e)) for e in _events()]
    offset = 0
    while queue:
        topic, raw = queue.pop(0)
        mine = [hosted[f.name] for f in folds if topic in f.inputs]
        folded = fold_records(mine, topic, 0, offset, raw, owners)
        offset += 1
        folded.store()
        for t, _key, value in folded:
            if t == "runwatch.dead-letters":
                letters.append(DeadLetter.model_validate_json(value))
            else:
                sent.append(value)
                queue.append((t, value))  # what it derives is read back, as on Kafka
    return letters, sent


def test_the_faust_agent_dead_letters_the_event_and_goes_on() -> None:
    _, clean = _faust_run(None)
    for at, error in (("apply", "ValueError"), ("dump", "TypeError: cannot persist int")):
        letters, sent = _faust_run(at)
        assert [d.kind for d in letters] == ["fold_failed"], at
        assert "run-health" in letters[0].reason and error in letters[0].reason
        assert letters[0].source_offset is not None
        assert len(sent) == len(clean), at  # every other record's outputs, as without it


def test_the_faust_agent_forgets_a_slot_a_fold_left_half_changed() -> None:
    """Found by review: the fold changed the cached slot in place before its state could
    not be stored; the next record folded on top of the change the dead letter said was
    not made (and a restart would not have it). The slot is loaded again from the table."""
    folds = _folds("dump")
    hosted = {f.name: (f, {}, SlotCache()) for f in folds}
    owners = agent_pins(list(hosted.values()))
    fold, table, cache = hosted["run-health"]
    for offset, ev in enumerate(_events()):
        if type(ev).TOPIC != "runwatch.telemetry" or fold.inner.key_of(ev) != RUN:
            continue
        folded = fold_records([hosted["run-health"]], type(ev).TOPIC, 0, offset, encode(ev), owners)
        folded.store()
        if ev.step == POISON and ev.type == "TrainerStepCompleted":
            assert [t for t, _, _ in folded] == ["runwatch.dead-letters"]
            assert RUN.encode() not in cache._live  # the stored slot is what counts now
            stored = table[RUN.encode()]
            assert cache.get(fold, RUN.encode(), stored).recent.first_time(ev.event_id)
            break
    else:
        raise AssertionError("the poisoned step was never folded")
