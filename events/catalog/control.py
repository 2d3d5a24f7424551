"""Commands to a run, as facts: who asked a run to pause, resume or stop, and why.

A command is a request, not a state: the run's state follows the trainer's answer
(:class:`~events.catalog.lifecycle.RunPaused` / ``RunResumed`` / ``RunCancelled``, each
naming the ``request_id`` it answers), never the request. Requests live on their own
topic, keyed by ``run_id`` like everything else, so a trainer follows exactly its own
run's partition and an auditor replays who asked what, when and why.

``actor`` says which kind of principal asked: the ``controller`` (the run-control
processor, acting on a paging alert named by ``alert_id``), an ``operator`` or the
``customer``; ``principal`` names them (a key id, an operator name) where known.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase

Actor = Literal["controller", "operator", "customer"]
CONTROL_TOPIC = "runwatch.control"


class _Command(EventBase):
    TOPIC: ClassVar[str] = CONTROL_TOPIC
    actor: Actor
    principal: str = ""
    reason: str = ""
    #: The alert that caused the request ('' when a person asked).
    alert_id: str = ""
    #: The control policy version the controller decided under ('' for people).
    policy_version: str = ""


class PauseRequested(_Command):
    """Stop generating and training at the end of the current step, checkpoint, wait."""

    type: Literal["PauseRequested"] = "PauseRequested"


class UnpauseRequested(_Command):
    """Continue a paused run from its pause checkpoint (through the resume gate). The API
    and CLI call this "resume"; the name ``ResumeRequested`` is the checkpoint room's fact
    that a (preempted) run is being restarted from a checkpoint."""

    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["UnpauseRequested"] = "UnpauseRequested"
    schema_version: int = 2
    #: Settings to change before continuing (the "fix"): only keys the trainer lists in
    #: its ``RESUME_OVERRIDES`` (e.g. ``lr``); the API refuses any other.
    overrides: Attributes = ()
    #: v2: the pause this resume answers, as its requester saw it: the ``request_id`` of
    #: the ``RunPaused`` that began the pause in effect, or that ``RunPaused``'s own event
    #: id when it named no request (:func:`producers.commands.pause_in_effect`). A run
    #: paused by another pause since refuses it (``CommandRejected``: a resume judged on a
    #: stale view must not lift a pause its requester never saw). '' (a v1 record, a
    #: client that names none): the pause in effect, whichever it is. Writers name a pause
    #: only to a process that declared it checks (``RunPaused.refuses_stale_resume``); a
    #: resume naming none is written as v1, which older trainers and hooks read.
    answers: str = ""


class CancelRequested(_Command):
    """End the run: the trainer stops and reports ``RunCancelled``."""

    type: Literal["CancelRequested"] = "CancelRequested"


class CommandRejected(EventBase):
    """A command that cannot apply (unknown run, finished run, resume of a run that is not
    paused...): recorded with the reason, never a state change."""

    TOPIC: ClassVar[str] = CONTROL_TOPIC
    type: Literal["CommandRejected"] = "CommandRejected"
    command_id: str
    command: str
    reason: str
