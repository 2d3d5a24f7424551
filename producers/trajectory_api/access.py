"""Who may use the trajectory API: holders of its bearer token, and no web page unless
its origin is allowed.

The reference server has no authentication and answers every origin with credentials
allowed, and its ``GET /reset_data`` wipes the queue, so any web page a trainer's browser
opens could reset, drain (``/batch``) or poison (``/scored_data``) a run. A pure ASGI
middleware, in front of everything but the CORS middleware, refuses before a body is
read:

- **Token.** With a token configured, every request but ``/health`` must carry
  ``Authorization: Bearer <token>`` (compared in constant time), else 401 with
  ``WWW-Authenticate: Bearer``. ``runwatch serve trajectories`` requires one when it
  binds beyond loopback; on loopback it is optional, and without it the API answers as
  the reference does.
- **Browsers.** A request a browser marks as coming from another site (an ``Origin``
  header that is not this server's own, or ``Sec-Fetch-Site: cross-site``/``same-site``
  with no allowed ``Origin``) is refused with 403 unless its origin is on the allow-list
  (``--cors-origin``; empty by default). That covers what CORS cannot: a page's
  ``<img src=".../reset_data">`` or ``fetch(..., {mode: "no-cors"})`` is sent by the
  browser whatever the server's CORS answer, and only its response is hidden from the
  page. Non-browser clients (requests, httpx, aiohttp) send neither header and are not
  affected.
- **DNS rebinding.** Without a token, a request whose ``Host`` is a name other than
  ``localhost`` (a page at ``evil.example`` whose name was re-pointed at 127.0.0.1 is
  same-origin to the browser) is refused with 403; IP literals are fine.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

#: Paths answered without the token (liveness probes carry none).
OPEN_PATHS = frozenset({"/health"})
#: ``Sec-Fetch-Site`` values of a request that a page of another origin made.
_FOREIGN_SITES = (b"cross-site", b"same-site")
#: Shortest token accepted (characters).
MIN_TOKEN_CHARS = 16


class AccessMiddleware:
    def __init__(
        self, app: ASGIApp, token: str | None = None, allowed_origins: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.allowed = frozenset(o.rstrip("/").lower().encode() for o in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> Response | None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        host = origin = site = auth = None
        for k, v in headers:
            if k == b"host":
                host = v
            elif k == b"origin":
                origin = v
            elif k == b"sec-fetch-site":
                site = v
            elif k == b"authorization":
                auth = v
        if self.token is None and host is not None and not _loopback_name(host):
            return _refused(
                403,
                f"Host {host.decode(errors='replace')!r} refused: without a token this API "
                "answers only to loopback addresses and localhost (DNS rebinding); give the "
                "server a token to serve other names",
            )
        if origin is not None:
            foreign = origin.lower() not in self.allowed and not _same_origin(origin, host)
        else:
            foreign = site in _FOREIGN_SITES
        if foreign:
            what = origin.decode(errors="replace") if origin is not None else "another site"
            return _refused(
                403,
                f"request from a web page of {what} refused: origins must be allowed "
                "explicitly (runwatch serve trajectories --cors-origin ORIGIN)",
            )
        if self.token is not None and scope["path"] not in OPEN_PATHS:
            scheme, _, given = (auth or b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
                return _refused(
                    401,
                    "missing or wrong bearer token (Authorization: Bearer <token>)",
                    {"WWW-Authenticate": 'Bearer realm="runwatch-trajectories"'},
                )
        return None


def _refused(status: int, detail: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """The request's page is this server's own (``Origin`` names the ``Host`` it asked)."""
    if host is None:
        return False
    return origin.lower() in (b"http://" + host.lower(), b"https://" + host.lower())


def _loopback_name(host: bytes) -> bool:
    """``Host`` names this machine without DNS: an IP literal or ``localhost``."""
    name = host.decode("latin-1").lower()
    if name.startswith("["):  # [v6]:port
        name = name[1 : name.find("]")] if "]" in name else name
    else:
        name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine (every address it names
    is a loopback address)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_token(token: str) -> str:
    """The token, stripped; ValueError if it is too weak to stand for a password."""
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ValueError(
            f"a token must be at least {MIN_TOKEN_CHARS} characters without spaces (e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token
