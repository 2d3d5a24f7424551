"""Customer notifications: which facts go to a tenant's webhook, the body, the signature,
and the retry decisions as a pure fold (hosted by ``runwatch.notifier``)."""

from stream_processors.notify.fold import (
    NotifierFold,
    NotifyPolicy,
    NotifyState,
    Pending,
    attempt_event,
    due,
    due_at,
)
from stream_processors.notify.payload import render
from stream_processors.notify.signing import signature, verify

__all__ = [
    "NotifierFold",
    "NotifyPolicy",
    "NotifyState",
    "Pending",
    "attempt_event",
    "due",
    "due_at",
    "render",
    "signature",
    "verify",
]
