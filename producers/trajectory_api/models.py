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
import itertools
import math
import re
import zlib
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple

import msgspec
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from events.envelope import MAX_INT


def _unicode_text(value: str) -> str:
    """Text that can go into an event: JSON's ``"\\ud800"`` escape parses to a lone
    surrogate, which UTF-8 cannot carry, so the event could not be written (a 500, found
    by the HTTP fuzz tests); a 422 says why instead."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode text (a lone surrogate)") from None
    return value


#: A string that is valid Unicode text (see :func:`_unicode_text`).
Text = Annotated[str, AfterValidator(_unicode_text)]


#: Largest size or length (sequences, tokens) a registration may give.
MAX_SIZE = 2**31 - 1
#: Largest step count or interval (the largest integer every JSON client reads exactly).
MAX_STEP = MAX_INT
#: Largest sampling weight of an env (weights are relative; finite, so sums stay finite).
MAX_WEIGHT = 1e9
#: Token ids (and mask values, distillation ids) must be below this: int64's range, what a
#: trainer's index tensor holds. A JSON integer of 19 digits or more never takes the fast
#: path (:func:`_int_rows`), so every larger one is refused on the full path (a 5,000-digit
#: id was stored and served, and every trainer that read ``/batch`` failed in
#: ``json.loads``, whose limit is 4,300 digits).
TOKEN_LIMIT = 2**63
#: Deepest nesting of lists and objects a free-form field (``messages``,
#: ``generation_params``, ``overrides``, ``group_overrides``, ``images``) may hold: a
#: ``/batch`` body nests each three levels deeper, and Python's ``json.loads`` fails at
#: about 1,000 (msgspec's decoder too, at the API: it used to be a 500).
MAX_NESTING = 64


class Registration(BaseModel):
    """``/register``. The reference takes any integers; a ``batch_size`` below 1 made
    every later group unbatchable (rejected on the log while its client heard
    "received"), and one of 400 digits crashed the batching processor (every later
    ``/batch`` a 503; found by the HTTP fuzz tests), so the numbers are bounded here
    (422, FastAPI's detail)."""

    wandb_group: Text
    wandb_project: Text
    batch_size: int = Field(ge=1, le=MAX_SIZE)
    max_token_len: int = Field(ge=1, le=MAX_SIZE)
    checkpoint_dir: Text
    save_checkpoint_interval: int = Field(ge=-MAX_STEP, le=MAX_STEP)
    starting_step: int = Field(ge=0, le=MAX_STEP)
    num_steps: int = Field(ge=0, le=MAX_STEP)


class RegisterEnv(BaseModel):
    """``/register-env``, bounded like :class:`Registration` (a 400-digit
    ``max_token_length`` made ``/status-env`` a 500 for every env)."""

    max_token_length: int = Field(ge=1, le=MAX_SIZE)
    desired_name: Text
    weight: float = Field(ge=0, le=MAX_WEIGHT, allow_inf_nan=False)
    group_size: int = Field(ge=1, le=MAX_SIZE)
    min_batch_allocation: float | None = Field(default=None, ge=0, le=1)
    #: runwatch extension (old clients omit it): staleness bound of this env's groups,
    #: in trainer steps; None falls back to the server's default.
    max_off_policy_steps: int | None = Field(default=None, ge=0, le=MAX_STEP)


class EnvIdentifier(BaseModel):
    env_id: int = Field(ge=-MAX_INT, le=MAX_INT)


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


#: The 422 item of a token or mask row holding an integer beyond 64 bits.
OUT_OF_RANGE: dict[str, Any] = {
    "type": "token_out_of_range",
    "loc": ["body"],
    "msg": "a token or mask row holds an integer that does not fit int64",
}
#: The 422 item of a body nested beyond what can be decoded.
TOO_DEEP: dict[str, Any] = {
    "type": "too_deep",
    "loc": ["body"],
    "msg": f"JSON nested too deeply (a free-form field may nest at most {MAX_NESTING} levels)",
}


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
#: ``bytes.translate`` table turning every digit into ``0`` (see :func:`_int_rows`).
_DIGITS_AS_ZERO = bytes(ord("0") if c in b"0123456789" else c for c in range(256))
#: A run of digits as long as the shortest integer that may reach :data:`TOKEN_LIMIT`.
_LONG_INT = b"0" * len(str(TOKEN_LIMIT - 1))


def parse_groups(body: bytes, many: bool) -> list[ScoredGroup]:
    """The groups in a ``/scored_data`` (one) or ``/scored_data_list`` (many) body.

    A body nested deeper than the decoder's recursion limit (about 1,000 levels, anywhere
    in it) is refused without being decoded further (:data:`TOO_DEEP`)."""
    try:
        return _MANY.decode(body) if many else [_ONE.decode(body)]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        fast_error = str(exc)
    except RecursionError:
        raise InvalidBody([dict(TOO_DEEP)]) from None
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


def accept_groups(body: bytes, many: bool, rules: GroupRules | None = None) -> list[AcceptedGroup]:
    """Validate a body (:func:`parse_groups`) and encode each group (:func:`encode_group`),
    with the cyclic garbage collector paused; token and mask rows that are plain integer
    arrays skip the round trip through Python ints (:func:`_groups_with_raw_ids`).

    A decoded 8 x 512-token group is dozens of young lists holding thousands of ints; they
    are freed by reference counting as soon as they are encoded, so a collection in between
    would only traverse them (perf: about 15% of the push path's CPU). Only summaries and
    bytes leave this function, so nothing decoded is alive when the collector resumes.

    With ``rules``, every group is also checked against them (:func:`group_errors`);
    one failing group fails the whole body (:class:`InvalidBody`, nothing accepted).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _accept(body, many, rules)
    finally:
        if enabled:
            gc.enable()


def _accept(body: bytes, many: bool, rules: GroupRules | None) -> list[AcceptedGroup]:
    out = []
    raw = _groups_with_raw_ids(body, many)
    groups: list[ScoredGroup] = raw if raw is not None else parse_groups(body, many)  # type: ignore[assignment]
    if rules is not None:
        detail = []
        for i, g in enumerate(groups):
            detail += group_errors(g, ("body", i) if many else ("body",), rules)
            if len(detail) >= MAX_ERRORS:
                break
        if detail:
            raise InvalidBody(detail[:MAX_ERRORS])
    for g in groups:
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
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None  # (too deep: the full path answers 422)
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
    take ``-0`` for a float) or an integer of 19 digits or more (it may not fit int64,
    see :data:`TOKEN_LIMIT`): those rows take the full path. The ``-0`` search runs only
    on rows with a ``-`` and through ``re`` (4x faster than ``bytes.__contains__`` on
    a two-byte needle); the long-integer search looks for 19 zeros (``in``) in the
    row with its digits turned into zeros (``re`` took 10x as long).
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
            or _LONG_INT in text.translate(_DIGITS_AS_ZERO)
        ):
            return None
        out.append(msgspec.Raw(text))
    return out


@dataclass(frozen=True)
class GroupRules:
    """What a scored group must be beyond its schema. The reference server checks none of
    it, so a malformed group was stored and answered "received", and then either rejected
    on the log (empty, larger than any batch) or handed to a trainer that indexes tokens,
    masks and scores together and embeds token ids (a CUDA assert at best).

    Always: at least one sequence; as many mask rows and scores as token rows; each mask
    row as long as its token row; no negative token id; ``env_id`` in ``[0, MAX_INT]``; token
    ids below :data:`TOKEN_LIMIT`, mask values and distillation ids within int64; free-form
    fields nested at most :data:`MAX_NESTING` deep. With ``vocab_size``: every token id
    below it, and every mask value either -100 (ignored) or below it. With
    ``max_sequences`` (the registered ``batch_size``): no group larger.
    """

    vocab_size: int | None = None
    max_sequences: int | None = None


#: At most this many problems are listed in one 422.
MAX_ERRORS = 20
#: The mask value of a position that is not trained on (the labels' ignore index).
IGNORED_LABEL = -100
#: In a raw mask row: a ``-`` that does not start ``-100`` (a negative other than it).
_NEGATIVE_NOT_IGNORED = re.compile(rb"-(?!100\b)")
_INTS = msgspec.json.Decoder(list[int])
#: The fields of a group that hold any JSON (see :data:`MAX_NESTING`).
_FREE_FORM = ("messages", "generation_params", "overrides", "group_overrides", "images")


def group_errors(
    g: ScoredGroup, loc: tuple[str | int, ...], rules: GroupRules
) -> list[dict[str, Any]]:
    """FastAPI-style 422 items for what ``g`` breaks of ``rules`` (empty: nothing).

    ``g`` is either path's group: rows of ints, or (the fast path) rows of raw JSON
    integer arrays without whitespace (see :func:`_int_rows`), checked as text where that
    is enough: a row's length is its comma count + 1, a negative id is a ``-``. Only a
    vocabulary bound decodes the rows (msgspec, then C ``min``/``max``)."""
    errors: list[dict[str, Any]] = []
    n = len(g.tokens)
    if n == 0:
        errors.append(_error(loc, "tokens", "empty_group", "a group needs at least one sequence"))
    for name in ("masks", "scores"):
        got = len(getattr(g, name))
        if got != n:
            msg = f"{got} {name} for {n} token rows; there must be one per sequence"
            errors.append(_error(loc, name, "length_mismatch", msg))
    if rules.max_sequences is not None and n > rules.max_sequences:
        msg = (
            f"a group of {n} sequences never fits in a batch of {rules.max_sequences} "
            "(the registered batch_size)"
        )
        errors.append(_error(loc, "tokens", "group_too_large", msg))
    if g.env_id is not None and g.env_id < 0:
        msg = "Input should be greater than or equal to 0"
        errors.append({**_error(loc, "env_id", "greater_than_equal", msg), "ctx": {"ge": "0"}})
    elif g.env_id is not None and g.env_id > MAX_INT:  # (an event's integers are bounded:
        msg = f"Input should be less than or equal to {MAX_INT}"  # a 500 after the payload
        errors.append(  # was appended, found by review)
            {**_error(loc, "env_id", "less_than_equal", msg), "ctx": {"le": str(MAX_INT)}}
        )
    for name in _FREE_FORM:
        if _nested_deeper(getattr(g, name), MAX_NESTING):
            msg = f"nested deeper than {MAX_NESTING} levels of lists and objects"
            errors.append(_error(loc, name, "too_deep", msg))
    vocab = rules.vocab_size
    for i, (tokens, masks) in enumerate(zip(g.tokens, g.masks)):
        t, m = _Row.of(tokens), _Row.of(masks)
        if t.length != m.length:
            msg = f"mask row of {m.length} values for a token row of {t.length} ids"
            errors.append(_error(loc, ("masks", i), "length_mismatch", msg))
        if (bad := t.bad_token(vocab)) is not None:
            msg = f"token id {_shown(bad)} is outside {_span(vocab, bad)}"
            errors.append(_error(loc, ("tokens", i), "token_out_of_range", msg))
        if (bad := m.bad_label(vocab)) is not None:
            if vocab is None:
                msg = f"mask value {_shown(bad)} does not fit int64"
            else:
                allowed = _span(vocab, bad)
                msg = f"mask value {_shown(bad)} is neither {IGNORED_LABEL} nor in {allowed}"
            errors.append(_error(loc, ("masks", i), "token_out_of_range", msg))
        if len(errors) >= MAX_ERRORS:
            break
    for i, seq in enumerate(g.distill_token_ids or ()):
        ids = list(itertools.chain.from_iterable(seq))
        if ids and (min(ids) < -TOKEN_LIMIT or max(ids) >= TOKEN_LIMIT):
            msg = "a distillation token id does not fit int64"
            errors.append(_error(loc, ("distill_token_ids", i), "token_out_of_range", msg))
            break
    return errors[:MAX_ERRORS]


def _span(vocab: int | None, bad: int) -> str:
    """The ids allowed, as the message of ``bad`` names them."""
    if bad >= TOKEN_LIMIT and (vocab is None or vocab > TOKEN_LIMIT):
        return "[0, 2**63) (int64)"
    return f"[0, {vocab})" if vocab is not None else "[0, vocab_size)"


def _shown(value: int) -> str:
    """``value`` for a message: a huge one (up to 4,300 digits) by its size only."""
    if -(10**30) < value < 10**30:
        return str(value)
    return f"{'-' if value < 0 else ''}<an integer of {value.bit_length()} bits>"


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels deep (a scalar
    is 0 levels, ``[]`` one). Level by level, without recursion; each container is
    visited once."""
    level = [value]
    for _ in range(limit):
        inner: list[Any] = []
        for v in level:
            if type(v) is dict:
                v = v.values()
            elif type(v) is not list:
                continue
            inner += [x for x in v if type(x) is list or type(x) is dict]
        if not inner:
            return False
        level = inner
    return True


def _error(
    loc: tuple[str | int, ...], where: str | tuple[str | int, ...], kind: str, msg: str
) -> dict[str, Any]:
    tail = (where,) if isinstance(where, str) else where
    return {"type": kind, "loc": [*loc, *tail], "msg": msg}


class _Row(NamedTuple):
    """One token or mask row for :func:`group_errors`: its ints (the full path), or its
    text (the fast path: a flat array of JSON integers, no whitespace)."""

    ints: list[int] | None
    text: bytes

    @classmethod
    def of(cls, row: list[int] | msgspec.Raw) -> _Row:
        return cls(None, bytes(row)) if isinstance(row, msgspec.Raw) else cls(row, b"")

    @property
    def length(self) -> int:
        if self.ints is not None:
            return len(self.ints)
        return 0 if self.text == b"[]" else self.text.count(b",") + 1

    def bad_token(self, vocab: int | None) -> int | None:
        """An id below 0 or not below ``vocab`` (if given) and :data:`TOKEN_LIMIT`, if any."""
        if self.ints is None and vocab is None and b"-" not in self.text:
            return None  # the common case: nothing to decode (and no id of 19 digits)
        ints = self.decoded()
        if ints and (lo := min(ints)) < 0:
            return lo
        limit = TOKEN_LIMIT if vocab is None else min(vocab, TOKEN_LIMIT)
        if ints and (hi := max(ints)) >= limit:
            return hi
        return None

    def bad_label(self, vocab: int | None) -> int | None:
        """A value neither -100 nor in ``[0, vocab)``, if any; without ``vocab``, one that
        does not fit int64 (only the full path's rows can hold one: nothing to decode)."""
        if vocab is None:
            if not self.ints:
                return None
            lo, hi = min(self.ints), max(self.ints)
            return hi if hi >= TOKEN_LIMIT else lo if lo < -TOKEN_LIMIT else None
        ints = self.decoded()
        if ints and (hi := max(ints)) >= min(vocab, TOKEN_LIMIT):
            return hi
        if self.ints is None and not _NEGATIVE_NOT_IGNORED.search(self.text):
            return None
        return next((v for v in ints if v < 0 and v != IGNORED_LABEL), None)

    def decoded(self) -> list[int]:
        """The row's ints. A raw row holds no integer of 19 digits (:func:`_int_rows`), so
        msgspec reads every one; should one not fit anyway, the body is refused (422)."""
        if self.ints is not None:
            return self.ints
        try:
            return _INTS.decode(self.text)
        except msgspec.ValidationError:  # (an integer beyond 64 bits)
            raise InvalidBody([dict(OUT_OF_RANGE)]) from None


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
