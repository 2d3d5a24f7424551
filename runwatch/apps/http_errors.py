"""The 422 answer of every runwatch HTTP app, safe to render whatever the client sent.

FastAPI's own handler echoes each invalid input in ``{"detail": [...]}`` and fails to
render it — a 500 instead of the 422 — when the input is bytes that are not UTF-8 (a body
sent as ``text/plain``), holds a lone surrogate (``"\\ud800"`` parses in JSON) or a NaN
(JSON responses refuse NaN). Found by the HTTP fuzz tests (``tests/integration/
test_http_fuzz.py``). :func:`install` replaces the handler: the same shape and the same
error entries, with inputs made JSON-safe (bytes decoded with U+FFFD, surrogates replaced,
non-finite floats as strings, nesting deeper than :data:`MAX_DEPTH` elided, long strings
cut), so a client always hears why.
"""

from __future__ import annotations

import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

#: Nesting of an echoed input kept in the answer (deeper levels become "...").
MAX_DEPTH = 16
#: Characters of one echoed string kept in the answer.
MAX_TEXT = 2000
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as something ``json.dumps(..., allow_nan=False)`` renders as UTF-8."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: MAX_TEXT * 4]).decode("utf-8", "replace")
    if isinstance(value, str):
        text = value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + "..."
        return _SURROGATE.sub("\ufffd", text)
    if depth >= MAX_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {json_safe(str(k)): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    return json_safe(str(value))


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse({"detail": json_safe(list(errors))}, status_code=422)


def install(app: FastAPI) -> FastAPI:
    """Answer request validation errors with :func:`validation_error` on ``app``."""
    app.add_exception_handler(RequestValidationError, validation_error)
    return app
