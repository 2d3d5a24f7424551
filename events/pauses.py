"""The pause in effect, read from a run's lifecycle facts: what a resume names
(``UnpauseRequested.answers``) and what the process holding the pause compares it with.

Shared by every room that writes or judges a resume (the API's view, the CLI, the
trainer, the hooks), so it lives with the language they share. Pure: facts in order
(one run, the lifecycle topic's order) in, the pause out; no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from events.catalog.lifecycle import RunCancelled, RunCompleted, RunPaused, RunResumed
from events.envelope import EventBase

__all__ = ["Pause", "next_pause", "pause_in_effect"]


@dataclass(frozen=True, slots=True)
class Pause:
    """A run's pause in effect. ``id``: the ``request_id`` of the ``RunPaused`` that began
    it (that ``RunPaused``'s own event id when it answered no request), what a resume
    names in ``UnpauseRequested.answers``. ``checked``: the process holding it now (the
    latest ``RunPaused``'s ``refuses_stale_resume``) refuses a resume naming another
    pause; when False (a trainer or hook of an earlier release) a resume names none, as
    that process reads v1 resumes only."""

    id: str
    checked: bool

    @property
    def answered_by(self) -> str:
        """What a resume of this pause puts in ``answers``: its id where the process
        holding it checks, else '' (a v1 resume)."""
        return self.id if self.checked else ""


def next_pause(current: Pause | None, ev: EventBase) -> Pause | None:
    """The pause in effect after lifecycle fact ``ev`` (``current`` before it): a
    ``RunPaused`` begins one when none is in effect, named by the ``request_id`` it answers
    (its own event id when it answers none: a trainer that paused itself); a restart's
    ``RunPaused`` ("still paused") continues the one in effect, held by the restarted
    process (whose ``refuses_stale_resume`` counts now). A ``RunResumed`` answering a
    request, a ``RunCompleted`` or a ``RunCancelled`` ends it (as the run's phase reads
    them: a restart is not a resume, a ``RunFailed`` ends no pause)."""
    if isinstance(ev, RunPaused):
        pause_id = current.id if current is not None else (ev.request_id or str(ev.event_id))
        return Pause(pause_id, ev.refuses_stale_resume)
    ended = isinstance(ev, RunCompleted | RunCancelled)
    if ended or (isinstance(ev, RunResumed) and ev.request_id):
        return None
    return current


def pause_in_effect(facts: Iterable[EventBase]) -> Pause | None:
    """The run's pause in effect after its lifecycle ``facts`` (:func:`next_pause`;
    ``None``: not paused)."""
    current: Pause | None = None
    for e in facts:
        current = next_pause(current, e)
    return current
