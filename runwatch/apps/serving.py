"""How runwatch's HTTP APIs are served: uvicorn with its connections bounded.

Shared by ``runwatch serve api`` and ``runwatch serve trajectories``. uvicorn (read in the
source of 0.54, httptools and h11 alike) closes a keep-alive connection
``timeout_keep_alive`` seconds after its last response, but it arms that timer only once
a response was sent, and any byte received disarms it: a connection that never completes
a request's headers (idle after connecting, or headers trickled in a line at a time,
"slowloris") is held for good, and httptools keeps every header byte it is sent. uvicorn's
``limit_concurrency`` answers 503 to new requests once that many connections are open,
but it still accepts and holds any number of connections. Each one holds a file
descriptor: at the open-files limit the query API's log follower could not open a segment
(``EMFILE``), and accepting stopped.

So the HTTP protocol here is uvicorn's own (:data:`uvicorn.protocols.http.auto`) with, on
top of it:

- **a header timeout**: a connection with no request in flight must complete a request's
  headers within ``header_timeout_s`` of connecting or of its last response, else it is
  closed (also when it is still sending the body of a request that was already answered,
  e.g. refused before its body was read);
- **a header size cap**: at most :data:`MAX_HEADER_BYTES` received while waiting for a
  request's headers, else ``431`` and closed;
- **a connection cap**: a connection beyond ``limit_concurrency`` open ones is closed at
  once (up to that many, uvicorn answers 503 to requests once the limit is reached).

At startup :func:`raise_open_files_limit` raises the soft ``RLIMIT_NOFILE`` to the hard
limit, and the default connection cap is :data:`DEFAULT_LIMIT_CONCURRENCY` or the
open-files limit less :data:`RESERVED_FDS` (files, the read model's SQLite connections,
the log), whichever is lower, so connections alone cannot exhaust the descriptors.

These bound one process; per-client limits (connections or request rates per address)
and TLS are a reverse proxy's job (docs/threat-model.md).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

Say = Callable[[str], None]

#: Connections held at most (by default; lowered to fit the open-files limit).
DEFAULT_LIMIT_CONCURRENCY = 1000
#: Seconds a keep-alive connection may idle after a response (uvicorn's default).
DEFAULT_KEEP_ALIVE_S = 5.0
#: Seconds a connection has to complete a request's headers (nginx's default is 60 s; a
#: client with a request ready sends its headers in one round trip).
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Header bytes accepted before a request's headers complete (h11's default is 16 KiB;
#: httptools has no limit of its own).
MAX_HEADER_BYTES = 64 << 10
#: Descriptors kept for everything but connections when the connection cap is derived
#: from the open-files limit (the thread pool's SQLite connections: 3 each, the log's
#: segments, the metrics port, the interpreter's own).
RESERVED_FDS = 256
#: The soft limit asked for when the hard limit is unlimited.
UNLIMITED_TARGET = 1 << 20

_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 32\r\n"
    b"connection: close\r\n\r\n"
    b"Request header fields too large\n"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection options both ``serve`` commands take."""
    parser.add_argument(
        "--limit-concurrency",
        type=_positive(int),
        metavar="N",
        help=f"connections held at most; at the limit requests get 503 and further "
        f"connections are closed (default {DEFAULT_LIMIT_CONCURRENCY}, or the open-files "
        f"limit less {RESERVED_FDS} if lower)",
    )
    parser.add_argument(
        "--keep-alive-s",
        type=_positive(float),
        default=DEFAULT_KEEP_ALIVE_S,
        metavar="S",
        help=f"close a connection idle this long after a response (default "
        f"{DEFAULT_KEEP_ALIVE_S:g})",
    )
    parser.add_argument(
        "--header-timeout-s",
        type=_positive(float),
        default=DEFAULT_HEADER_TIMEOUT_S,
        metavar="S",
        help=f"close a connection that has not sent a whole request's headers this long "
        f"after connecting or after its last response (default {DEFAULT_HEADER_TIMEOUT_S:g})",
    )


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
        return value

    return parse


def raise_open_files_limit() -> tuple[int, int, int | None] | None:
    """Raise the soft open-files limit to the hard one: ``(before, after, hard)`` (``hard``
    ``None``: unlimited), or ``None`` where the platform has no ``resource`` module. A
    refused raise keeps the old limit (``after == before``)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    target = UNLIMITED_TARGET if hard == unlimited else hard
    if soft == unlimited:
        soft = target  # nothing to raise; report the usable figure
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft, None if hard == unlimited else hard
    return soft, max(soft, target), None if hard == unlimited else hard


def connection_limit(asked: int | None, open_files: int | None) -> tuple[int, str | None]:
    """The connection cap and, when there is one, a warning. ``asked``: the option
    (``None``: the default, fitted under ``open_files``); an explicit value is kept."""
    room = None if open_files is None else max(open_files - RESERVED_FDS, open_files // 2)
    if asked is None:
        return (
            DEFAULT_LIMIT_CONCURRENCY if room is None else min(DEFAULT_LIMIT_CONCURRENCY, room)
        ), None
    if room is not None and asked > room:
        return asked, (
            f"--limit-concurrency {asked} is more connections than the open-files limit "
            f"({open_files}) leaves room for ({room}): idle connections can starve the "
            "server of descriptors (raise the hard limit, ulimit -Hn, or lower "
            "--limit-concurrency)"
        )
    return asked, None


def guarded_protocol(
    header_timeout_s: float, max_header_bytes: int = MAX_HEADER_BYTES
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with the header timeout, the header size cap and the
    connection cap (see the module docstring). Assumes uvicorn's protocol attributes
    ``cycle`` (the latest request, with ``response_complete`` and ``more_body``; ``None``
    before the first), ``connections`` (the server's open connections, this one
    included), ``limit_concurrency``, ``transport`` and ``loop``:
    ``tests/integration/test_query_api_hardening.py`` checks the behaviour on the
    installed uvicorn."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class GuardedProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            limit = self.limit_concurrency
            if limit is not None and len(self.connections) > limit:
                transport.close()  # over the cap: the descriptor is given back at once
                return
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            waiting = self._waiting()
            super().data_received(data)
            if not waiting or self.transport.is_closing():
                return
            if not self._waiting():  # this chunk completed a request's headers
                self._header_bytes = 0
                return
            self._header_bytes += len(data)
            if self._header_bytes > max_header_bytes:
                self.transport.write(_TOO_LARGE)
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            """Waiting for a request's headers (not for an unanswered request, and not
            discarding the rest of an answered request's body)?"""
            cycle = self.cycle
            return cycle is None or (cycle.response_complete and not cycle.more_body)

        def _await_headers(self) -> None:
            self._stop_timer()
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _stop_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            cycle = self.cycle
            idle = cycle is None or cycle.response_complete
            if idle and not self.transport.is_closing():
                self.transport.close()

    return GuardedProtocol


def serve(
    app: Any, host: str, port: int, args: argparse.Namespace, say: Say, warn: Say, **extra: Any
) -> None:
    """Run ``app`` with uvicorn on ``host:port`` with the options of :func:`add_arguments`
    (``extra``: more ``uvicorn.run`` keywords); the limits in force are said first."""
    import uvicorn

    limits = raise_open_files_limit()
    open_files = None if limits is None else limits[1]
    if limits is not None:
        before, after, hard = limits
        if after > before:
            what = "the hard limit" if hard is not None else "the hard limit is unlimited"
            say(f"open files limit: raised from {before} to {after} ({what})")
        elif hard is not None and after < hard:
            warn(f"open files limit: {after}, could not raise it to the hard limit {hard}")
        else:
            say(f"open files limit: {after} (already the hard limit)")
    limit, warning = connection_limit(args.limit_concurrency, open_files)
    if warning:
        warn(warning)
    say(
        f"connections: at most {limit}; request headers within {args.header_timeout_s:g} s, "
        f"keep-alive {args.keep_alive_s:g} s"
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=guarded_protocol(args.header_timeout_s),  # type: ignore[arg-type]
        ws="none",  # neither API speaks WebSocket
        limit_concurrency=limit,
        timeout_keep_alive=args.keep_alive_s,  # type: ignore[arg-type]
        **extra,
    )
