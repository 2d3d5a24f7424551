"""Dead letters: a record that did not decode or validate, with the reason and raw bytes.

A dead letter is not an :class:`~events.envelope.EventBase` (it may lack a run or tenant).
It lives on :data:`events.topics.DEAD_LETTER_TOPIC`, encoded as JSON with the raw bytes
in base64, and nothing about the original record is lost.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

DeadLetterKind = Literal[
    "malformed_json",
    "not_an_object",
    "missing_type",
    "unknown_type",
    "future_schema_version",
    "upcast_failed",
    "validation_error",
    "foreign_tenant",
    "key_too_long",
    "refused_at_ingest",
    "fold_failed",
]


class DeadLetter(BaseModel):
    """Why a record was refused, and the record itself.

    ``foreign_tenant``: a valid event whose run id belongs to another tenant (the run's
    first); the hosts refuse it rather than fold it into that run. ``key_too_long``: a
    Kafka record whose key the embedded log cannot hold (an export keeps its value here).
    ``fold_failed``: a valid event a processor's fold raised on (a bug, or an input no
    validation foresaw): not folded by that fold, its other folds and every other record
    go on, instead of the processors stopping for every tenant on every start.

    ``error_types`` are pydantic error codes (``float_parsing``, ``missing``, …) for
    validation errors, so tests and operators match on codes, not message text.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    kind: DeadLetterKind
    reason: str
    error_types: tuple[str, ...] = ()
    event_type: str | None = None
    raw: bytes
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None

    def located(self, topic: str, partition: int, offset: int) -> DeadLetter:
        """The same dead letter, stamped with where the bad record was read."""
        return self.model_copy(
            update={"source_topic": topic, "source_partition": partition, "source_offset": offset}
        )

    def encode(self) -> bytes:
        return self.model_dump_json().encode()
