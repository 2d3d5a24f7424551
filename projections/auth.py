"""Who is asking: the one API-key dependency of the query API and the dashboard, and the
middleware that keeps request bodies from unknown clients out.

A request names its key as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (the
Bearer token wins when both are sent); :meth:`projections.keys.ApiKeys.resolve` finds its
tenant or operator. No key, or one not in the keys file: ``401`` with
``WWW-Authenticate: Bearer``, the same answer either way.

FastAPI reads (and parses) a request's body before the dependencies run, so the
dependency alone would let anyone make the server hold any body. :class:`KeyedBodies`
answers first: a request that carries a body needs a valid key before a byte of it is
received, and bodies are capped at :data:`MAX_BODY_BYTES`.

Events name an operator by the ``name`` of the key's entry in the keys file and the
key's id (the first 12 hex digits of its sha256, which names the key without revealing
it): :func:`operator_label`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Header, HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from projections.keys import ApiKeys, Principal, digest

#: The largest request body the query API reads: its bodies are a command's reason (500
#: characters) and at most 8 settings, far below this.
MAX_BODY_BYTES = 64 << 10
#: Hex digits of a key's sha256 that name it in events.
KEY_ID_CHARS = 12
UNAUTHORIZED = "missing or invalid API key"


@dataclass(frozen=True, slots=True)
class Caller(Principal):
    """A principal, with the sha256 of the key it was resolved from."""

    key_sha256: str = field(default="", repr=False)

    @property
    def key_id(self) -> str:
        return self.key_sha256[:KEY_ID_CHARS]


def key_of(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request names: the Bearer token, else ``X-API-Key``."""
    key = x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        key = authorization[7:].strip()
    return key


def resolve(keys: ApiKeys, authorization: str | None, x_api_key: str | None) -> Caller | None:
    """The caller of a request with these headers, or ``None`` (no key, or not valid)."""
    key = key_of(authorization, x_api_key)
    found = keys.resolve(key)
    if found is None or key is None:
        return None
    return Caller(found.tenant_id, found.operator, digest(key))


def principal_of(keys: ApiKeys) -> Callable[..., Awaitable[Principal]]:
    """The FastAPI dependency that resolves a request's key against ``keys`` (a
    :class:`Caller`)."""

    async def principal(
        authorization: Annotated[str | None, Header()] = None,
        x_api_key: Annotated[str | None, Header()] = None,
    ) -> Principal:
        found = resolve(keys, authorization, x_api_key)
        if found is None:
            raise HTTPException(401, UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
        return found

    return principal


# -- request bodies ------------------------------------------------------------------------


class KeyedBodies:
    """ASGI middleware: no body byte from a request without a valid key, none beyond
    ``max_bytes``.

    A request that carries a body (``Content-Length`` above 0, or ``Transfer-Encoding``)
    without a valid key is answered 401, exactly as the dependency answers, before any of
    its body is received; one whose ``Content-Length`` is over the cap is answered 413
    likewise; a streamed (chunked) body is counted as it arrives and answered 413 once it
    passes the cap. What the client sends after the answer is discarded by the HTTP
    server, not held. A body within the cap is read whole and handed on unchanged, so the
    app sees the request as it was sent. Requests without a body pass untouched (their
    routes' dependency answers their 401)."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.keys = keys
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length, chunked, authorization, x_api_key = None, False, None, None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-api-key":
                x_api_key = value.decode("latin-1")
        if not chunked and length in (None, b"0"):
            await self.app(scope, receive, send)  # no body: nothing to hold
            return
        if resolve(self.keys, authorization, x_api_key) is None:
            headers = {"WWW-Authenticate": "Bearer"}
            await JSONResponse({"detail": UNAUTHORIZED}, 401, headers)(scope, receive, send)
            return
        declared = int(length) if length is not None and length.isdigit() else None
        try:
            if declared is not None and declared > self.max_bytes:
                raise _TooLarge
            body = await self._read(receive)
        except _TooLarge:
            detail = f"request body exceeds {self.max_bytes} bytes"
            await JSONResponse({"detail": detail}, 413)(scope, receive, send)
            return
        except _Gone:  # the client left before its body was in
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes:
        """The whole body (:class:`_TooLarge` once it passes the cap)."""
        parts: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            parts.append(chunk)
        return b"".join(parts)


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    pass


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` in one message, then the client's own messages
    (the disconnect, when it comes)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


# -- naming operators in events ------------------------------------------------------------


def operator_label(keys: ApiKeys, who: Principal) -> str:
    """How events name an operator: ``"alice (key 3f9a1c2b7d4e)"`` (the ``name`` of its
    key's entry), or ``"key 3f9a1c2b7d4e"`` for an entry without one (``"operator"`` if
    the key is not known, which the API never has)."""
    sha = getattr(who, "key_sha256", "")
    if not sha:
        return "operator"
    name = keys.name_of(sha)
    kid = f"key {sha[:KEY_ID_CHARS]}"
    return f"{name} ({kid})" if name else kid
