"""A valid run id from a free-form name (a framework's experiment name).

Run ids are checked by the envelope (:func:`events.identity.check_id`: at most 256
characters, no control characters, ``/`` or ``\\``, not ``.`` or ``..``). A name the
customer gave for display (verl's ``trainer.experiment_name``, e.g. ``qwen2.5/grpo-gsm8k``)
is made one: the refused characters become ``_``, and a name too long keeps its start and a
digest of the whole, so two long names stay two ids.
"""

from __future__ import annotations

import hashlib

from events.identity import ID_REFUSED, MAX_ID_CHARS, check_id


def id_from_name(name: str) -> str:
    """``name`` as a valid run id (itself when it already is one)."""
    out = ID_REFUSED.sub("_", name) or "run"
    if out in (".", ".."):
        out = out.replace(".", "_")
    if len(out) > MAX_ID_CHARS:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        out = f"{out[: MAX_ID_CHARS - 17]}-{digest}"
    return check_id(out)
