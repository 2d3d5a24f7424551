"""The wire contract of the Atropos trajectory API (seed 004), as its reference server
(PyPI ``atroposlib`` 0.4, ``atroposlib/api/server.py``) de-facto accepts it.

Request bodies are validated exactly like the reference: missing required fields are a
422 with FastAPI's ``{"detail": [...]}`` shape; a message without ``role`` or ``content``
is a 422; unknown extra fields are ignored. A group is stored as ``/batch`` returns it:
every field of :class:`ScoredData`, in the reference's order, ``null`` where absent.

Scored groups are the hot path (megabytes of token ids per request), so they are decoded
and validated by :class:`ScoredGroup` (msgspec, lax like pydantic's default mode) and
re-encoded with msgspec; only a body that fails is validated again by the pydantic
:class:`ScoredData` to produce FastAPI's exact error list. Both describe one schema
(a unit test holds them equal).
"""

from __future__ import annotations

import gc
import math
import re
import zlib
from typing import Any, NamedTuple

import msgspec
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, field_validator


class Registration(BaseModel):
    wandb_group: str
    wandb_project: str
    batch_size: int
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int
    num_steps: int


class RegisterEnv(BaseModel):
    max_token_length: int
    desired_name: str
    weight: float
    group_size: int
    min_batch_allocation: float | None = None
    #: runwatch extension (old clients omit it): staleness bound of this env's groups,
    #: in trainer steps; None falls back to the server's default.
    max_off_policy_steps: int | None = None


class EnvIdentifier(BaseModel):
    env_id: int


class ScoredData(BaseModel):
    """One scored group. Field order is the reference's ``_scored_data_to_dict`` order."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any | None = None
    env_id: int | None = None
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None

    @field_validator("messages")
    @classmethod
    def _role_and_content(
        cls, v: list[list[dict[str, Any]]] | None
    ) -> list[list[dict[str, Any]]] | None:
        if v is not None:
            for conversation in v:
                for msg in conversation:
                    if "role" not in msg or "content" not in msg:
                        raise ValueError("Message must have 'role' and 'content' fields")
        return v


SCORED_DATA = TypeAdapter(ScoredData)
SCORED_DATA_LIST = TypeAdapter(list[ScoredData])


class ScoredGroup(msgspec.Struct):
    """The fast twin of :class:`ScoredData` (same fields, same order, same checks)."""

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any | None = None
    env_id: int | None = None
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None

    def __post_init__(self) -> None:
        if self.messages is not None:
            for conversation in self.messages:
                for msg in conversation:
                    if "role" not in msg or "content" not in msg:
                        raise ValueError("Message must have 'role' and 'content' fields")


class _RawIdsGroup(ScoredGroup):
    """:class:`ScoredGroup` with each row of ``tokens`` and ``masks`` kept as raw JSON
    text: the fast path of :func:`accept_groups`, taken only when every row is a plain
    array of JSON integers (see :func:`_int_rows`). A subclass: the redefined fields keep
    their places, every other field and check is the parent's."""

    tokens: list[msgspec.Raw]  # type: ignore[assignment]
    masks: list[msgspec.Raw]  # type: ignore[assignment]


class InvalidBody(Exception):
    """A body that does not validate; ``detail`` is FastAPI's 422 error list."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(detail)
        self.detail = detail


_ONE = msgspec.json.Decoder(ScoredGroup, strict=False)
_MANY = msgspec.json.Decoder(list[ScoredGroup], strict=False)
_RAW_ONE = msgspec.json.Decoder(_RawIdsGroup, strict=False)
_RAW_MANY = msgspec.json.Decoder(list[_RawIdsGroup], strict=False)
_ENCODER = msgspec.json.Encoder()
_JSON_SPACE = b" \t\n\r"


#: ``bytes.translate`` table keeping what a JSON integer array is made of (digits, ``,``,
#: ``-``, brackets) and mapping every other byte to NUL (see :func:`_int_rows`).
_INT_ROW_TABLE = bytes(c if c in b"0123456789,-[]" else 0 for c in range(256))
#: In a valid JSON integer array, ``-0`` can only be the integer minus zero.
_NEGATIVE_ZERO = re.compile(rb"-0")


def parse_groups(body: bytes, many: bool) -> list[ScoredGroup]:
    """The groups in a ``/scored_data`` (one) or ``/scored_data_list`` (many) body."""
    try:
        return _MANY.decode(body) if many else [_ONE.decode(body)]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        fast_error = str(exc)
    try:  # the slow path, for FastAPI's exact error list
        (SCORED_DATA_LIST if many else SCORED_DATA).validate_json(body)
    except ValidationError as exc:
        raise InvalidBody(error_detail(exc)) from None
    raise InvalidBody([{"type": "value_error", "loc": ["body"], "msg": fast_error}])


class AcceptedGroup(NamedTuple):
    """What the ingress keeps of a validated group: its summary and its ``/batch`` bytes."""

    env_id: int | None
    num_sequences: int
    mean_score: float | None
    payload: bytes
    crc: int  # zlib CRC-32 of payload


def accept_groups(body: bytes, many: bool) -> list[AcceptedGroup]:
    """Validate a body (:func:`parse_groups`) and encode each group (:func:`encode_group`),
    with the cyclic garbage collector paused; token and mask rows that are plain integer
    arrays skip the round trip through Python ints (:func:`_groups_with_raw_ids`).

    A decoded 8 x 512-token group is dozens of young lists holding thousands of ints; they
    are freed by reference counting as soon as they are encoded, so a collection in between
    would only traverse them (perf: about 15% of the push path's CPU). Only summaries and
    bytes leave this function, so nothing decoded is alive when the collector resumes.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _accept(body, many)
    finally:
        if enabled:
            gc.enable()


def _accept(body: bytes, many: bool) -> list[AcceptedGroup]:
    out = []
    groups = _groups_with_raw_ids(body, many)
    for g in groups if groups is not None else parse_groups(body, many):
        finite = [s for s in g.scores if math.isfinite(s)]
        mean = sum(finite) / len(finite) if finite else None
        payload = _ENCODER.encode(g)
        out.append(AcceptedGroup(g.env_id, len(g.tokens), mean, payload, zlib.crc32(payload)))
    return out


def _groups_with_raw_ids(body: bytes, many: bool) -> list[_RawIdsGroup] | None:
    """The fast path of :func:`accept_groups`: token and mask ids are not turned into
    Python ints and back (that was most of a push's CPU), their rows are copied as JSON
    text without whitespace. Taken only where the result is byte for byte what
    :func:`parse_groups` and :func:`encode_group` give; None sends the body down that
    full path (lax values, errors and their wording included)."""
    try:
        groups = _RAW_MANY.decode(body) if many else [_RAW_ONE.decode(body)]
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    for g in groups:
        tokens, masks = _int_rows(g.tokens), _int_rows(g.masks)
        if tokens is None or masks is None:
            return None
        g.tokens, g.masks = tokens, masks
    return groups


def _int_rows(rows: list[msgspec.Raw]) -> list[msgspec.Raw] | None:
    """Each row without JSON whitespace, if every row is a flat array of JSON integers.

    A row is one JSON value (msgspec checked its syntax). One ``translate`` removes the
    whitespace and turns every byte that cannot be part of an integer array into NUL;
    the rest are ``memchr`` scans: no NUL (no ``.``, exponent, quote, letter or brace:
    no float, string or lax value), a ``[`` first and no other bracket but the last
    ``]`` (flat). What is left is a row of integers written exactly as msgspec writes
    them, unless it holds a ``-0`` (written ``0``; some readers, serde_json among them,
    take ``-0`` for a float): those rows take the full path. The ``-0`` search runs only
    on rows with a ``-`` and through ``re`` (4x faster than ``bytes.__contains__`` on
    a two-byte needle).
    """
    out = []
    for row in rows:
        text = bytes(row).translate(_INT_ROW_TABLE, _JSON_SPACE)
        if (
            b"\0" in text
            or text[:1] != b"["
            or text.find(b"[", 1) != -1
            or text.find(b"]", 0, -1) != -1
            or (b"-" in text and _NEGATIVE_ZERO.search(text) is not None)
        ):
            return None
        out.append(msgspec.Raw(text))
    return out


def encode_group(group: ScoredGroup) -> bytes:
    """The group as ``/batch`` returns it: every field, null where absent."""
    return _ENCODER.encode(group)


def error_detail(exc: ValidationError, prefix: tuple[str | int, ...] = ("body",)) -> list[Any]:
    """FastAPI's 422 ``detail`` list for a pydantic error."""
    detail = []
    for err in exc.errors(include_url=False):
        item: dict[str, Any] = {
            "type": err["type"],
            "loc": [*prefix, *err["loc"]],
            "msg": err["msg"],
        }
        if "ctx" in err:
            item["ctx"] = {k: str(v) for k, v in err["ctx"].items()}
        detail.append(item)
    return detail
