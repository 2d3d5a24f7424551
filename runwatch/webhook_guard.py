"""Where a tenant's webhook may point: public addresses only, unless the operator says so.

A webhook URL is the tenant's input (the operator copies it into the keys file): pointed at
``http://169.254.169.254/...``, ``http://localhost:9090/...`` or a service on the platform's
own network, the notifier would POST signed JSON there from inside that network (a
request forged on the tenant's behalf to whatever listens there), and time each attempt's
outcome — a probe of the inside. So before each attempt the URL's host is resolved
and every address it resolves to must be globally routable (``ipaddress``'s ``is_global``,
and not multicast); otherwise the attempt fails with the reason, no connection is made, and
the usual retries and abandonment follow. ``--allow-private-webhooks`` lifts the check (a
receiver on the operator's own network, the tests' loopback receiver).

The check runs twice: :func:`destination_refusal` before an attempt (the reason recorded,
no connection), and :class:`PublicOnlyBackend` inside the HTTP client at connect time,
which resolves the name itself and connects to the very address it checked — so a name
server answering a public address to the first lookup and a private one to the next (DNS
rebinding) gets no connection either. TLS still verifies the certificate against the
URL's host name (httpcore takes the server name from the request, not from the address
connected to). Redirects are never followed (``runwatch/notifier.py``), so a public URL
cannot bounce the POST inside.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx


def refused_address(address: str) -> bool:
    """Whether ``address`` (an IPv4 or IPv6 literal) is one a webhook may not reach."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id is no address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


async def destination_refusal(url: str) -> str:
    """Why the notifier may not POST to ``url`` ('' when it may): a host that resolves to
    a private, loopback, link-local or otherwise non-public address, or none (the same
    judgement as :class:`PublicOnlyBackend` at connect time)."""
    host = ""
    try:  # any failure to name an address is a refusal, never an exception out of here
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        await _public_addresses(host, port)
    except ValueError as exc:  # a bad port
        return f"cannot resolve webhook host {host!r}: {exc}"[:300]
    except httpcore.ConnectError as exc:
        return f"{exc}: refused (an operator allows it with --allow-private-webhooks)"[:400]
    return ""


async def _public_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, if all are public; else ``httpcore.ConnectError``."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:
        msg = f"cannot resolve webhook host {host!r}: {exc}"[:300]
        raise httpcore.ConnectError(msg) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    inside = sorted(a for a in addresses if refused_address(a))
    if inside or not addresses:
        raise httpcore.ConnectError(
            f"webhook host {host!r} resolves to a non-public address "
            f"({', '.join(inside[:3]) or 'none'})"
        )
    return addresses


class PublicOnlyBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to public addresses: it resolves the
    host itself, refuses if any address is not public, and connects to a checked address
    (one lookup, so no second answer can differ)."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        error: Exception | None = None
        for address in await _public_addresses(host, port):
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:  # the next address, as a resolver would
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a webhook is never a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def public_only_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """An httpx transport whose connections go through :class:`PublicOnlyBackend` (TLS
    verified as httpx's default transport does).

    Assumes httpx's transport keeps its connection pool in ``_pool`` (httpx 0.18 to 0.28;
    ``tests/unit/runwatch/test_webhook_guard.py`` fails if that changes)."""
    transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=PublicOnlyBackend(),
    )
    return transport
