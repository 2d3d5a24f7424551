"""The envelope every runwatch event carries, and the helpers that build envelopes.

Every event is a frozen pydantic model subclassing :class:`EventBase`. The envelope
fields are the same for all events:

- ``event_id`` (UUID): the idempotency key. Producers use uuid4; derived events use
  :func:`derived_id` (uuid5 of their inputs) so a replay emits byte-identical outputs.
- ``type``: the discriminator tag, a past-tense name such as ``"TrainerStepCompleted"``.
- ``schema_version``: version of this type's payload. A changed payload is a new version
  plus an upcaster in :mod:`events.upcasting`, never an edit of an old version.
- ``tenant_id`` / ``run_id``: identity; ``run_id`` is the partition key. What each may be
  (at most 256 characters, no control characters, ``/`` or ``\\``, not ``.`` or ``..``):
  :mod:`events.identity` (a customer's hook names them).
- ``step``: training step where it applies, else ``None``. Every integer field, this one
  included, lies within ``±MAX_INT`` (2**53 - 1); ``seq`` within a signed 64-bit int.
- ``ts``: unix seconds as the *producer* saw them, finite. Folds read time only from here.
- ``producer``: who wrote it (e.g. ``"trainer/run-7"``; :mod:`events.identity`); ``seq``:
  that producer's monotonic counter, so gaps are visible.

Assumptions: NaN and infinities are legal metric values (a NaN is a fact worth reporting),
so they are serialized as the JSON constants ``NaN``/``Infinity`` which the codec reads back.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Le
from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, model_validator

from events.identity import EventTime, Identifier, ProducerName

#: Namespace of every derived event id; never change it (ids would change on replay).
RUNWATCH_NAMESPACE = uuid.UUID("6f1c3c52-6a63-4f1e-9b7e-2f4d8f0b7a11")
_NAMESPACE_BYTES = RUNWATCH_NAMESPACE.bytes

#: The largest integer any event field holds: 2**53 - 1, what every reader holds exactly
#: (a JavaScript number, a SQLite INTEGER, a msgpack int, a float's mantissa). A record
#: with a larger one is refused at decode (dead-lettered), so no host, store or consumer
#: meets an integer it cannot persist (one tenant's 2**70 stopped every tenant's
#: processors: their state codec could not write it).
MAX_INT = 2**53 - 1
#: An integer field of an event: bounded by :data:`MAX_INT` either way.
Int = Annotated[int, Ge(-MAX_INT), Le(MAX_INT)]
#: A count (never negative), bounded alike.
Count = Annotated[int, Ge(0), Le(MAX_INT)]
#: The envelope's ``seq``: a signed 64-bit integer (what SQLite and msgpack hold), since
#: writers of commands number them from ``time.time_ns()`` (~1.8e18, past ``MAX_INT``).
Seq = Annotated[int, Ge(-(2**63)), Le(2**63 - 1)]

Scalar = str | Int | float | bool | None


def _to_pairs(value: Any) -> Any:
    if type(value) is tuple:  # already pairs (the common path when copying an event)
        return value
    if type(value) is dict or isinstance(value, Mapping):
        return tuple(sorted((str(k), v) for k, v in value.items()))
    return value


def _to_dict(pairs: tuple[tuple[str, Scalar], ...]) -> dict[str, Scalar]:
    return dict(pairs)


#: A frozen str -> scalar mapping: held as sorted pairs, written as a JSON object.
Attributes = Annotated[
    tuple[tuple[str, Scalar], ...],
    BeforeValidator(_to_pairs),
    PlainSerializer(_to_dict, return_type=dict),
]


class EventBase(BaseModel):
    """Envelope fields shared by all events. Subclasses add ``type`` and payload fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    #: Topic the event type lives on (a name from :mod:`events.topics`).
    TOPIC: ClassVar[str]
    #: Current payload version of the type; older versions are upcast on decode.
    SCHEMA_VERSION: ClassVar[int] = 1

    event_id: uuid.UUID
    type: str
    schema_version: int = 1
    tenant_id: Identifier
    run_id: Identifier
    step: Int | None = None
    ts: EventTime
    producer: ProducerName
    seq: Seq

    _registry: ClassVar[dict[str, type[EventBase]]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        field = cls.model_fields.get("type")
        tag = getattr(field, "default", None) if field else None
        if isinstance(tag, str) and not tag.startswith("_"):
            if tag in EventBase._registry and EventBase._registry[tag] is not cls:
                raise TypeError(f"event type {tag!r} registered twice")
            EventBase._registry[tag] = cls

    @model_validator(mode="after")
    def _current_version(self) -> EventBase:
        if self.schema_version != self.SCHEMA_VERSION:
            raise ValueError(
                f"{self.type} schema_version {self.schema_version} is not the current "
                f"version {self.SCHEMA_VERSION}; decode through events.codec to upcast"
            )
        return self

    def key(self) -> bytes:
        """The partition key: the run id, so one run's events stay ordered."""
        return self.run_id.encode()


def event_classes() -> dict[str, type[EventBase]]:
    """Every registered event class by its ``type`` tag (catalog modules must be imported)."""
    return dict(EventBase._registry)


def derived_id(*parts: object) -> uuid.UUID:
    """Deterministic id of a derived event: uuid5 over its inputs' identities.

    Pass the deriving processor's name and whatever makes the output unique (input
    event ids, a window, a detector). The same inputs always give the same id.
    """
    name = "|".join(map(str, parts)).encode()
    # uuid.uuid5 without its per-call import and namespace conversion, and the UUID built
    # without its Python-level __init__ (a hot path of every fold): the same 128 bits with
    # the same version and variant, hence the same id (a unit test compares them)
    digest = _sha1(_NAMESPACE_BYTES + name).digest()[:16]
    value = (_from_bytes(digest, "big") & _CLEAR_V5) | _SET_V5
    out = _new_uuid(_UUID)
    _setattr(out, "int", value)
    _setattr(out, "is_safe", _UNKNOWN_SAFETY)
    return out


_sha1, _from_bytes, _UUID = hashlib.sha1, int.from_bytes, uuid.UUID
_new_uuid, _setattr, _UNKNOWN_SAFETY = object.__new__, object.__setattr__, uuid.SafeUUID.unknown
#: what ``uuid.UUID(..., version=5)`` does to the bits: RFC 4122 variant, version 5
_CLEAR_V5 = ~((0xC000 << 48) | (0xF000 << 64))
_SET_V5 = (0x8000 << 48) | (5 << 76)


def derive_envelope(source: EventBase, producer: str, *parts: object) -> dict[str, Any]:
    """Envelope fields of an event derived from ``source``: same tenant/run/step/ts,
    a deterministic id, and ``seq`` 0 (derived streams are ordered by their input)."""
    return {
        "event_id": derived_id(producer, source.event_id, *parts),
        "tenant_id": source.tenant_id,
        "run_id": source.run_id,
        "step": source.step,
        "ts": source.ts,
        "producer": producer,
        "seq": 0,
    }


def new_envelope(
    *,
    tenant_id: str,
    run_id: str,
    producer: str,
    seq: int,
    step: int | None = None,
    ts: float | None = None,
) -> dict[str, Any]:
    """Envelope fields of a new primary fact: a random id, and now if ``ts`` is not given."""
    return {
        "event_id": uuid.uuid4(),
        "tenant_id": tenant_id,
        "run_id": run_id,
        "step": step,
        "ts": time.time() if ts is None else ts,
        "producer": producer,
        "seq": seq,
    }


class Stamper:
    """The envelopes of one producer's new facts: a random id each, ``seq`` counting up
    from ``first_seq`` (a resumed producer passes its last seq + 1, so gaps stay
    meaningful), ``ts`` now unless given. Shared by the emitter SDK
    (``producers.emitter``) and producers that may not import it (the sandbox client).
    Thread-safe: two threads never get the same ``seq``."""

    __slots__ = ("_lock", "producer", "run_id", "seq", "tenant_id")

    def __init__(self, *, tenant_id: str, run_id: str, producer: str, first_seq: int = 0):
        self.tenant_id = tenant_id
        self.run_id = run_id
        self.producer = producer
        #: the ``seq`` the next envelope gets
        self.seq = first_seq
        self._lock = threading.Lock()

    def stamp(
        self, *, step: int | None = None, ts: float | None = None, run_id: str | None = None
    ) -> dict[str, Any]:
        """The next envelope (``run_id``: another run of the same producer, if given)."""
        with self._lock:
            seq = self.seq
            self.seq += 1
        return new_envelope(
            tenant_id=self.tenant_id,
            run_id=self.run_id if run_id is None else run_id,
            producer=self.producer,
            seq=seq,
            step=step,
            ts=ts,
        )
