"""The envelope's identity fields: what a tenant id, a run id and a producer name may be.

A customer's hook names its run id and tenant, and they become Kafka record keys (the
embedded log takes keys under 64 KiB), path components (``runwatch profile`` plot
directories, run directories) and one-line terminal text downstream. So a tenant or run id
is at most :data:`MAX_ID_CHARS` characters, none of them a control character (C0, DEL, C1),
``/`` or ``\\``, and neither ``.`` nor ``..`` (:func:`check_id`); a producer name (a role and
an id, ``trainer/<run id>``) at most :data:`MAX_NAME_CHARS`, no control characters
(:func:`check_name`). :data:`Identifier` and :data:`ProducerName` are the pydantic types the
envelope declares (their exported JSON schemas say the same rules); the hosts' fast
decoder runs the same checks (``events.fast_decode``).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, WithJsonSchema

#: The longest tenant or run id, in characters (a Kafka key every log backend takes: the
#: embedded log's limit is 64 KiB, Kafka's a few MiB).
MAX_ID_CHARS = 256
#: Every producer name a customer's hook writes under begins so (``RunwatchHook``'s
#: default; the ingest gateway refuses any other from a tenant): facts a tenant's own job
#: reported, which claim nothing about the platform (a failure's class, say).
HOOK_PRODUCER_PREFIX = "hook/"
#: The longest producer name (a role and an id, e.g. ``trainer/<run id>``).
MAX_NAME_CHARS = 2 * MAX_ID_CHARS
#: the characters an id may not hold (control characters, ``/``, ``\\``)
ID_REFUSED = re.compile(r"[\x00-\x1f\x7f-\x9f/\\]")
_NAME_REFUSED = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: Ids and names that passed their check. A run's ids repeat in every one of its events,
#: so each is checked once; the sets are bounded (emptied when full: a fleet interleaving
#: more runs than this would check ids again, ~0.5 us a record) and only ever hold values
#: that passed, so a decoder may skip the check for a member (a few MB at most).
PASSED_IDS: set[str] = set()
PASSED_NAMES: set[str] = set()
_PASSED_CAP = 16384


def _passed(into: set[str], value: str) -> str:
    if len(into) >= _PASSED_CAP:
        into.clear()
    into.add(value)
    return value


def check_id(value: str) -> str:
    """``value`` if it is a valid tenant or run id (see the module docstring), else
    ``ValueError`` saying why."""
    if value in PASSED_IDS:
        return value
    if len(value) > MAX_ID_CHARS:
        raise ValueError(f"at most {MAX_ID_CHARS} characters, not {len(value)}")
    if value in (".", ".."):
        raise ValueError(f"{value!r} is not an id")
    bad = ID_REFUSED.search(value)
    if bad is not None:
        raise ValueError(
            f"no control characters, '/' or '\\' in an id ({bad.group()!r} at {bad.start()})"
        )
    return _passed(PASSED_IDS, value)


def check_name(value: str) -> str:
    """``value`` if it is a valid producer name (at most :data:`MAX_NAME_CHARS`
    characters, no control characters), else ``ValueError``."""
    if value in PASSED_NAMES:
        return value
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"at most {MAX_NAME_CHARS} characters, not {len(value)}")
    bad = _NAME_REFUSED.search(value)
    if bad is not None:
        raise ValueError(f"no control characters in a name ({bad.group()!r} at {bad.start()})")
    return _passed(PASSED_NAMES, value)


#: A tenant or run id (:func:`check_id`; the exported JSON schema says the same rule, for
#: producers in other languages).
Identifier = Annotated[
    str,
    AfterValidator(check_id),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": MAX_ID_CHARS,
            "not": {
                "anyOf": [
                    {"pattern": "[\\u0000-\\u001f\\u007f-\\u009f/\\\\]"},
                    {"enum": [".", ".."]},
                ]
            },
        }
    ),
]
#: A producer's name (:func:`check_name`).
ProducerName = Annotated[
    str,
    AfterValidator(check_name),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": MAX_NAME_CHARS,
            "not": {"pattern": "[\\u0000-\\u001f\\u007f-\\u009f]"},
        }
    ),
]
#: Event time: unix seconds, finite.
EventTime = Annotated[float, Field(allow_inf_nan=False)]
