"""One valid instance of every registered event type, built from its fields.

Used to prove that *every* type round-trips (codec, embedded log, Kafka) without a
hand-kept list that silently misses new types.
"""

from __future__ import annotations

import types
import typing
import uuid
from typing import Any, Literal, Union, get_args, get_origin

from events import event_classes
from events.envelope import EventBase

_ENVELOPE = set(EventBase.model_fields)


def _value(annotation: Any, name: str) -> Any:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return _value(args[0], name)
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return _value(non_none[0], name)
    if origin is Literal:
        return args[-1]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = args[0]
            if get_origin(inner) is tuple:  # Attributes pairs
                return {f"{name}_k": 1.5}
            return (_value(inner, name),)
        return tuple(_value(a, name) for a in args)
    if annotation is str:
        return f"{name}-value"
    if annotation is bool:
        return True
    if annotation is int:
        return 7
    if annotation is float:
        return 0.25
    raise TypeError(f"no sample for {annotation!r} ({name})")


def sample(cls: type[EventBase], i: int = 0, run_id: str = "run-1") -> EventBase:
    fields: dict[str, Any] = {
        "event_id": uuid.UUID(int=i + 1),
        "tenant_id": "tenant-a",
        "run_id": run_id,
        "step": i,
        "ts": 1_700_000_000.0 + i,
        "producer": "tests",
        "seq": i,
    }
    for name, info in cls.model_fields.items():
        if name in _ENVELOPE or name == "type":
            continue
        fields[name] = _value(info.annotation, name)
    return cls(**fields)


def all_samples() -> list[EventBase]:
    return [sample(cls, i) for i, cls in enumerate(sorted(event_classes().values(), key=str))]


def forged_steps(
    events: list[EventBase], run_id: str, tenant: str, n: int = 3, **changes: Any
) -> list[EventBase]:
    """``n`` steps of ``tenant`` on ``run_id``'s id, past the run's last
    ``TrainerStepCompleted`` in ``events``, with a reward ten times the run's (and
    ``changes``): folded into the run they page ``reward_explosion_collapse`` and the
    controller pauses it. What another tenant's producer forges in the tenant tests."""
    last = [e for e in events if e.type == "TrainerStepCompleted" and e.run_id == run_id][-1]
    assert last.step is not None
    reward = 10 * (getattr(last, "reward_mean", None) or 1.0)
    return [
        last.model_copy(
            update={
                "event_id": uuid.uuid4(),
                "tenant_id": tenant,
                "step": last.step + 1 + i,
                "ts": last.ts + 1 + i,
                "reward_mean": reward,
                **changes,
            }
        )
        for i in range(n)
    ]
