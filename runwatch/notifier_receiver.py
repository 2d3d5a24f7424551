"""A reference webhook receiver: verifies, deduplicates and records runwatch notifications.

What a customer's endpoint should do, in ~100 lines of the standard library, and what the
tests and ``benchmarks/webhook_delivery.py`` run on loopback: read the raw body, check
``X-Runwatch-Signature`` over ``"<X-Runwatch-Timestamp>." + body`` with the tenant's secret
and the timestamp's age (:func:`stream_processors.notify.signing.verify`), answer 401 if
either fails, and treat a ``X-Runwatch-Delivery`` id seen before as delivered (200, not
processed again).

``answer``: a callable ``(Received) -> int`` (or ``(status, extra headers)``) choosing the
status per request — tests script failures with it (e.g. 500 for the first two attempts
of each id). Every request is kept in :attr:`WebhookReceiver.received`.

Whatever else arrives gets a 4xx and never a hang (HTTP fuzz tests): another method 405,
a missing, negative or non-numeric ``Content-Length`` 411/400, a body over
:data:`MAX_BODY_BYTES` 413 before it is read, a stalled sender dropped after
:data:`READ_TIMEOUT_S`. (Before, a non-numeric length or attempt header dropped the
connection unanswered, a negative length read until the sender closed, and GET was 501.)

Run by hand (prints one line per notification)::

    python -m runwatch.notifier_receiver --port 9000 --secret-file acme.secret
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stream_processors.notify.signing import (
    ATTEMPT_HEADER,
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    verify,
)

#: Largest body read (a notification is a few KiB); 413 beyond it, before reading.
MAX_BODY_BYTES = 1 << 20
#: Seconds a connection may stall mid-request before it is dropped.
READ_TIMEOUT_S = 10.0


def _content_length(h: BaseHTTPRequestHandler) -> int | None:
    """The body's length; None when it is absent, not a decimal number, or negative (a
    ``read(-1)`` would wait for the sender to close)."""
    raw = h.headers.get("Content-Length")
    if raw is None:
        return 0 if h.headers.get("Transfer-Encoding") is None else None
    raw = raw.strip()
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 19 else None


def _int(raw: str | None) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def _answer(
    h: BaseHTTPRequestHandler,
    status: int,
    extra: dict[str, str] | None = None,
    *,
    close: bool = False,
) -> None:
    """An empty answer; ``close``: and no further request on this connection."""
    try:
        h.send_response(status)
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", "0")
        if close:
            h.send_header("Connection", "close")  # also sets h.close_connection
        h.end_headers()
    except OSError:
        pass  # the sender gave up (timeout): nothing to answer


@dataclass
class Received:
    path: str
    delivery_id: str
    attempt: int
    body: bytes
    headers: dict[str, str]
    valid: bool  # signature and timestamp checked
    arrived: float  # time.time() when the body was read
    duplicate: bool = False  # this delivery id was accepted before
    status: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # the sender went away or stalled (a killed notifier): not our error
        super().handle_error(request, client_address)


Answer = Callable[[Received], "int | tuple[int, dict[str, str]]"]


@dataclass
class WebhookReceiver:
    """A threaded HTTP server on ``host`` (port 0: a free one) with one secret per path
    (``secrets``: path -> secret; a path not listed uses ``default_secret``)."""

    secrets: dict[str, bytes] = field(default_factory=dict)
    default_secret: bytes | None = None
    answer: Answer | None = None
    host: str = "127.0.0.1"
    port: int = 0
    delay_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    accepted: dict[str, int] = field(default_factory=dict)  # delivery id -> 2xx answers

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = READ_TIMEOUT_S  # a client that stalls mid-request is dropped

            def do_POST(self) -> None:
                receiver._handle(self)

            def _not_post(self) -> None:
                # its body (if any) is not read: the connection cannot carry another request
                _answer(self, 405, {"Allow": "POST"}, close=True)

            def __getattr__(self, name: str) -> Any:
                if name.startswith("do_"):  # any other method, known or not (stdlib: 501)
                    return self._not_post
                raise AttributeError(name)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = _Server((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = _content_length(h)
        if length is None:  # the body's end is unknown: no next request on this connection
            _answer(h, 400 if "Content-Length" in h.headers else 411, close=True)
            return
        if length > MAX_BODY_BYTES:
            _answer(h, 413, close=True)
            return
        try:
            body = h.rfile.read(length)
        except OSError:  # stalled past READ_TIMEOUT_S, or reset
            body = b""
        if len(body) < length:
            h.close_connection = True
            return  # the sender went away or stalled mid-body: nothing to answer
        arrived = time.time()
        secret = self.secrets.get(h.path, self.default_secret)
        headers = {k: v for k, v in h.headers.items()}
        valid = secret is not None and verify(
            secret,
            body,
            h.headers.get(TIMESTAMP_HEADER),
            h.headers.get(SIGNATURE_HEADER),
            now=time.time(),
        )
        rec = Received(
            path=h.path,
            delivery_id=h.headers.get(DELIVERY_HEADER, ""),
            attempt=_int(h.headers.get(ATTEMPT_HEADER)),
            body=body,
            headers=headers,
            valid=valid,
            arrived=arrived,
        )
        extra: dict[str, str] = {}
        if not valid:
            status = 401
        else:
            answer = self.answer(rec) if self.answer is not None else 200
            status, extra = answer if isinstance(answer, tuple) else (answer, {})
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            rec.status = status
            if 200 <= status < 300:
                seen = self.accepted.get(rec.delivery_id, 0)
                rec.duplicate = seen > 0
                self.accepted[rec.delivery_id] = seen + 1
            self.received.append(rec)
        _answer(h, status, extra)

    def attempts_of(self, delivery_id: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.delivery_id == delivery_id]

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "requests": len(self.received),
                "invalid": sum(not r.valid for r in self.received),
                "delivered": len(self.accepted),
                "duplicates": sum(n - 1 for n in self.accepted.values()),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--secret-file", required=True)
    args = parser.parse_args()
    with open(args.secret_file, "rb") as f:
        secret = f.read().strip()

    def show(rec: Received) -> int:
        note = " (duplicate)" if rec.delivery_id in receiver.accepted else ""
        text = rec.body.decode(errors="replace")
        print(f"{rec.delivery_id!r} attempt {rec.attempt}{note}: {text!r}", flush=True)
        return 200

    receiver = WebhookReceiver(default_secret=secret, answer=show, host=args.host, port=args.port)
    print(f"listening on {receiver.url('/')} (Ctrl-C to stop)", flush=True)
    with receiver, contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()


if __name__ == "__main__":
    main()
