"""Shared set-up of the fuzz tests (issue #19 item 4): the hypothesis profile and the
strategies for hostile JSON.

Profile: ``ci`` (the default) is derandomized — the same examples on every run and every
machine, so a failure reproduces by running the test again — keeps no example database
and prints the reproduction blob of a failing example. ``RUNWATCH_FUZZ_PROFILE=explore``
draws fresh random examples (to hunt for new crashes; add what it finds as a regression
example). Budgets are per test (``max_examples``), sized so the whole fuzz set runs in
well under two minutes on a 2-core box.

JSON is written by :func:`to_json`, which also emits what ``json.dumps`` will not: NaN and
infinities, integers of thousands of digits, lone surrogates as ``\\ud800`` escapes,
nesting 100,000 deep (:class:`RawJSON` splices raw text in).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "explore",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("RUNWATCH_FUZZ_PROFILE", "ci"))


class RawJSON(str):
    """JSON text spliced verbatim by :func:`to_json`."""


def to_json(value: Any) -> str:
    """``value`` as JSON text; :class:`RawJSON` verbatim, floats as NaN/Infinity too."""
    if isinstance(value, RawJSON):
        return str(value)
    if value is None or isinstance(value, (bool, str)):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    raise TypeError(type(value))


def _nested(depth: int, kind: str) -> RawJSON:
    if kind == "list":
        return RawJSON("[" * depth + "]" * depth)
    return RawJSON('{"a":' * depth + "1" + "}" * depth)


#: Values JSON can carry that no field of ours should take whole.
RAW_NASTIES = st.one_of(
    st.sampled_from(
        [
            RawJSON("NaN"),
            RawJSON("Infinity"),
            RawJSON("-Infinity"),
            RawJSON("1e400"),
            RawJSON("-1e400"),
            RawJSON("1E+999999999"),
            RawJSON("-0"),
            RawJSON('"\\ud800"'),
            RawJSON('"a\\udfffb"'),
            RawJSON('"\\udbff\\udbff"'),
            RawJSON('"\\u0000\\u001b[31m\\u202e"'),
            RawJSON('"' + "a" * 100_000 + '"'),
            RawJSON("[" + ",".join(["1"] * 50_000) + "]"),
        ]
    ),
    st.integers(min_value=19, max_value=6000).map(lambda n: RawJSON("9" * n)),
    st.integers(min_value=19, max_value=6000).map(lambda n: RawJSON("-" + "9" * n)),
    st.builds(
        _nested,
        st.sampled_from([64, 200, 1000, 100_000]),
        st.sampled_from(["list", "dict"]),
    ),
)

#: Plain JSON values of every type, small.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
PLAIN = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
#: Text JSON can carry and UTF-8 cannot: a lone surrogate, as its JSON escape.
LONE_SURROGATES = st.builds(
    lambda head, s, tail: RawJSON(json.dumps(head + chr(s) + tail)),
    st.text(max_size=6),
    st.integers(min_value=0xD800, max_value=0xDFFF),
    st.text(max_size=6),
)
#: Any value a hostile client could put where a field belongs.
HOSTILE_VALUES = st.one_of(PLAIN, RAW_NASTIES, LONE_SURROGATES)


@st.composite
def mutated_document(draw: st.DrawFn, base: dict[str, Any], keep: tuple[str, ...] = ()) -> str:
    """``base`` (a valid document) with 1-4 of: a field dropped, a field's value replaced
    by a hostile one, an extra field added; ``keep`` names fields left alone."""
    doc = dict(base)
    keys = [k for k in doc if k not in keep]
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["drop", "replace", "replace", "extra"]))
        if op == "extra" or not keys:
            doc[draw(st.text(min_size=1, max_size=12))] = draw(HOSTILE_VALUES)
            continue
        key = draw(st.sampled_from(keys))
        if op == "drop":
            doc.pop(key, None)
        else:
            doc[key] = draw(HOSTILE_VALUES)
    return to_json(doc)


@st.composite
def damaged_bytes(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` cut short, or with random bytes written over or into it."""
    op = draw(st.sampled_from(["truncate", "overwrite", "insert"]))
    at = draw(st.integers(min_value=0, max_value=max(0, len(valid) - 1)))
    junk = draw(st.binary(min_size=1, max_size=8))
    if op == "truncate":
        return valid[:at]
    if op == "overwrite":
        return valid[:at] + junk + valid[at + len(junk) :]
    return valid[:at] + junk + valid[at:]


# -- HTTP ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One route: method, path template (``{name}`` parameters), query parameter names,
    and a valid JSON body to start from (None: the route takes no body)."""

    method: str
    path: str
    query: tuple[str, ...] = ()
    body: Any = None

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(re.findall(r"{(\w+)}", self.path))


def fastapi_endpoints(app: Any, bodies: dict[str, Any] | None = None) -> list[Endpoint]:
    """Every route of a FastAPI app (``bodies``: a valid body per path template)."""
    from fastapi.routing import APIRoute

    out = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        query = tuple(p.alias for p in route.dependant.query_params)
        for method in sorted(route.methods):
            out.append(Endpoint(method, route.path, query, (bodies or {}).get(route.path)))
    return out


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    url: str
    params: tuple[tuple[str, str], ...]
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes | None

    def send(self, client: Any, timeout: float | None = None) -> Any:
        kw: dict[str, Any] = {"params": self.params, "headers": list(self.headers)}
        if self.body is not None:
            kw["content"] = self.body
        if timeout is not None:
            kw["timeout"] = timeout
        return client.request(self.method, self.url, **kw)


SEGMENTS = st.one_of(
    st.text(max_size=24),
    st.sampled_from(
        ["", ".", "..", "%2e%2e", "../../etc/passwd", "a" * 5000, "\x00", "ü", "%", "run-0001"]
    ),
)
QUERY_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(
        ["", "nan", "inf", "-1", "0", "1e309", "0x1f", "9" * 5000, "1.5", "true", "null", "[]"]
    ),
    st.text(max_size=20),
)
HEADER_BYTES = st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if 0x20 <= c <= 0x7E or c >= 0x80).strip()
)
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD")


def _quote(segment: str) -> str:
    return quote(segment.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def json_body(draw: st.DrawFn, base: Any) -> bytes:
    """A body for a route whose valid body is ``base``: valid, mutated, or not JSON."""
    choice = draw(st.sampled_from(["valid", "mutated", "mutated", "hostile", "bytes"]))
    if choice == "valid" and base is not None:
        return to_json(base).encode()
    if choice in ("mutated", "valid") and isinstance(base, dict):
        return draw(mutated_document(base)).encode("utf-8", "surrogatepass")
    if choice in ("mutated", "valid") and isinstance(base, list) and base:
        items = list(base)
        at = draw(st.integers(min_value=0, max_value=len(items) - 1))
        items[at] = RawJSON(draw(mutated_document(items[at])))
        return to_json(items).encode("utf-8", "surrogatepass")
    if choice == "hostile":
        return to_json(draw(HOSTILE_VALUES)).encode("utf-8", "surrogatepass")
    return draw(st.binary(max_size=256))


@st.composite
def http_request(
    draw: st.DrawFn,
    endpoint: Endpoint,
    ids: tuple[str, ...] = (),
    auths: tuple[tuple[tuple[bytes, bytes], ...], ...] = ((),),
) -> FuzzRequest:
    """A request aimed at ``endpoint``: its method mostly, hostile path parameters (or
    known ``ids``), hostile query values, one of ``auths`` or garbage credentials, odd
    content types and encodings, a valid, mutated or random body."""
    method = draw(st.sampled_from((endpoint.method,) * 6 + METHODS))
    url = endpoint.path
    for name in endpoint.params:
        value = draw(st.one_of(st.sampled_from(ids), SEGMENTS) if ids else SEGMENTS)
        url = url.replace("{" + name + "}", _quote(value))
    names = draw(st.lists(st.sampled_from(endpoint.query), unique=True)) if endpoint.query else []
    names += draw(st.lists(st.text(min_size=1, max_size=8), max_size=2))
    params = tuple((n, draw(QUERY_VALUES)) for n in names)
    headers = list(draw(st.sampled_from(auths)))
    if draw(st.integers(0, 4)) == 0:  # (no blank around a value: clients refuse to send it)
        headers.append((b"Authorization", (b"Bearer " + draw(HEADER_BYTES)).strip()))
    if draw(st.integers(0, 4)) == 0:
        headers.append((b"X-API-Key", draw(HEADER_BYTES)))
    body: bytes | None = None
    if endpoint.body is not None or method in ("POST", "PUT", "PATCH") or draw(st.booleans()):
        body = draw(json_body(endpoint.body))
        kind = draw(
            st.sampled_from([b"application/json"] * 3 + [b"text/plain", b"", b"multipart/x"])
        )
        headers.append((b"Content-Type", kind))
        how = draw(st.sampled_from(["plain"] * 4 + ["gzip", "gzip_lie", "deflate"]))
        if how == "gzip":
            body = gzip.compress(body, mtime=0)
            headers.append((b"Content-Encoding", b"gzip"))
        elif how == "gzip_lie":
            headers.append((b"Content-Encoding", b"gzip"))
        elif how == "deflate":
            headers.append((b"Content-Encoding", b"deflate"))
    if draw(st.booleans()):
        headers.append((b"Accept-Encoding", b"gzip"))
    return FuzzRequest(method, url, params, tuple(headers), body)
