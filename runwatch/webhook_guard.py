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

Not defended: DNS rebinding between this check and httpx's own lookup (an attacker's
name server answering a public address first and a private one a moment later); pinning
the connection to the checked address is the remedy (not built). Redirects are never
followed (``runwatch/notifier.py``), so a public URL cannot bounce the POST inside.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit


def refused_address(address: str) -> bool:
    """Whether ``address`` (an IPv4 or IPv6 literal) is one a webhook may not reach."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id is no address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


async def destination_refusal(url: str) -> str:
    """Why the notifier may not POST to ``url`` ('' when it may): a host that resolves to
    a private, loopback, link-local or otherwise non-public address, or none."""
    host = ""
    try:  # any failure to name an address is a refusal, never an exception out of here
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:  # DNS, a bad port, a name IDNA cannot encode
        return f"cannot resolve webhook host {host!r}: {exc}"[:300]
    addresses = sorted({str(info[4][0]) for info in infos})
    inside = [a for a in addresses if refused_address(a)]
    if inside or not addresses:
        return (
            f"webhook host {host!r} resolves to a non-public address "
            f"({', '.join(inside[:3]) or 'none'}): refused (an operator allows it with "
            "--allow-private-webhooks)"
        )
    return ""
