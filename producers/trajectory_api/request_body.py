"""Request bodies, bounded: read whole, at most ``max_bytes``, gzip inflated as it
streams in, under a budget shared by every request in flight.

A pure ASGI middleware in front of the routers (which then read ``await request.body()``
as before). For each request with a body:

- **Size.** A body over ``max_bytes`` (``Content-Length`` says so up front, or the bytes
  that arrive do, or a ``Content-Encoding: gzip`` body inflates beyond it) is a 413 with
  a JSON ``detail``. The check happens before the bytes are held: a declared length is
  refused before anything is read, and gzip is inflated chunk by chunk with the output
  capped at what is still allowed, so a 1,000:1 gzip bomb costs at most ``max_bytes``,
  never its inflated size. What the client still sends after the answer is discarded by
  the HTTP server, not buffered.
- **Concurrency.** Every body's bytes are taken from one :class:`BodyBudget` as they
  arrive or inflate, before they are held, and given back when the request is answered.
  A request whose next bytes do not fit gets 503 with ``Retry-After`` (the same answer
  as a full queue, which clients already retry on), so many large pushes at once cannot
  add up beyond the budget; so does one whose declared length does not fit in what is
  free when it starts (nothing is taken for it: a declared length is only a claim, and
  two connections that declared 64 MiB and sent nothing used to hold the whole budget).
- **Time.** A body must keep coming: a request that sends no body byte for
  ``timeout_s`` (default 30 s), or whose body has not all arrived ``timeout_s`` plus one
  second per ``min_rate`` bytes received (default 256 KiB/s: Apache's
  ``mod_reqtimeout`` rule) after it started, gets 408 and its connection is closed. So no
  request holds budget bytes longer than ``timeout_s + max_bytes / min_rate`` (about
  five minutes at the defaults), however it trickles.
- **Gzip.** The request arrives inflated, without ``Content-Encoding`` and with its real
  ``Content-Length``, as Atropos clients expect of the reference server. A body that is
  not valid gzip is a 400 ``Invalid gzip payload`` (the reference's answer).

Requests without a body (no ``Content-Length``, no ``Transfer-Encoding``) pass through.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Default largest body, plain or inflated: 64 MiB. A real push is far smaller (the
#: benchmark's 25 groups of 8 x 512 tokens are 1.4 MB; a list of 1,000 such groups 55 MB).
MAX_BODY_BYTES = 64 << 20
#: Default budget of body bytes held by all requests in flight: two maximal bodies. A
#: held byte costs more than itself while the push is validated and encoded (a 63 MiB
#: push of 8 x 512-token groups raised the server's peak RSS by 294 MiB), so this bounds
#: the pushes' memory at roughly 5x the budget.
MAX_INFLIGHT_BODY_BYTES = 2 * MAX_BODY_BYTES
#: Inflated bytes produced per ``decompress`` call.
INFLATE_STEP = 1 << 20
#: Default longest pause in a body, and the grace before :data:`BODY_MIN_RATE` applies.
BODY_TIMEOUT_S = 30.0
#: Default slowest average a body may arrive at, beyond the first ``timeout_s`` (bytes/s):
#: a 64 MiB body gets 30 s + 256 s, a 1.4 MB push 30 s + 5 s.
BODY_MIN_RATE = 256 << 10


class BodyBudget:
    """Bytes of request bodies held at once, at most ``limit`` (single event loop: no
    lock needed, nothing awaits between the check and the take)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        self.peak = max(self.peak, self.held)
        return True

    def give(self, n: int) -> None:
        self.held -= n


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


class _Gone(Exception):
    pass


class _Slow(Exception):
    pass


class RequestBodyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = MAX_BODY_BYTES,
        budget: BodyBudget | None = None,
        timeout_s: float = BODY_TIMEOUT_S,
        min_rate: float = BODY_MIN_RATE,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.budget = budget if budget is not None else BodyBudget(MAX_INFLIGHT_BODY_BYTES)
        self.timeout_s = timeout_s
        self.min_rate = min_rate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        length_header = next((v for k, v in headers if k == b"content-length"), None)
        chunked = any(k == b"transfer-encoding" for k, _ in headers)
        if not chunked and length_header in (None, b"0"):
            await self.app(scope, receive, send)  # no body: nothing to bound
            return
        encoding = next((v for k, v in headers if k == b"content-encoding"), b"")
        gzipped = b"gzip" in encoding.lower()
        declared = int(length_header) if length_header and length_header.isdigit() else None
        reader = _BodyReader(self, gzipped)
        try:
            if declared is not None:
                if declared > self.max_bytes:
                    raise _TooLarge
                if not gzipped and declared > self.budget.limit - self.budget.held:
                    raise _Busy  # would not fit now: said before a byte is read (none taken)
            body = await reader.read(receive)
        except _TooLarge:
            reader.release()
            await self._too_large(gzipped)(scope, receive, send)
            return
        except _Busy:
            reader.release()
            await self._busy()(scope, receive, send)
            return
        except _Slow:
            reader.release()
            await self._too_slow(reader)(scope, receive, send)
            return
        except zlib.error:
            reader.release()
            await PlainTextResponse("Invalid gzip payload", status_code=400)(scope, receive, send)
            return
        except _Gone:  # the client went away before its body was in
            reader.release()
            return
        try:
            new_headers = [
                (k, v)
                for k, v in headers
                if k not in (b"content-encoding", b"content-length", b"transfer-encoding")
            ]
            new_headers.append((b"content-length", str(len(body)).encode()))
            sent = False

            async def whole_body() -> Message:
                nonlocal sent
                if sent:
                    return await receive()  # the disconnect, when it comes
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            inner: dict[str, Any] = {**scope, "headers": new_headers}
            await self.app(inner, whole_body, send)
        finally:
            reader.release()

    def _too_large(self, gzipped: bool) -> Response:
        what = "inflated request body" if gzipped else "request body"
        return JSONResponse(
            {"detail": f"{what} exceeds {self.max_bytes} bytes; send smaller requests"},
            status_code=413,
        )

    def _too_slow(self, reader: _BodyReader) -> Response:
        return JSONResponse(
            {
                "detail": f"request body too slow: {reader.raw} bytes in "
                f"{reader.elapsed():.1f} s (a body may pause at most {self.timeout_s:g} s, "
                f"and must come at {self.min_rate:g} bytes/s beyond that); send it at once"
            },
            status_code=408,
            headers={"Connection": "close"},  # (the rest of the body is never read)
        )

    def _busy(self) -> Response:
        budget = self.budget
        return JSONResponse(
            {
                "detail": f"too many request bytes in flight ({budget.held} of {budget.limit} "
                "held by other requests); retry"
            },
            status_code=503,
            headers={"Retry-After": "1"},
        )


class _BodyReader:
    """One request's body: read, inflated if gzip, bounded in size and time, its bytes
    taken from the budget as they are held and all given back by :meth:`release`."""

    def __init__(self, owner: RequestBodyMiddleware, gzipped: bool) -> None:
        self.max_bytes = owner.max_bytes
        self.budget = owner.budget
        self.timeout_s = owner.timeout_s
        self.min_rate = owner.min_rate
        self.gzipped = gzipped
        self.held = 0
        self.size = 0  # bytes of the body (inflated) so far
        self.raw = 0  # bytes of the body as sent so far
        self.loop = asyncio.get_running_loop()
        self.started = self.loop.time()

    def elapsed(self) -> float:
        return self.loop.time() - self.started

    async def _next(self, receive: Receive) -> Message:
        """The next message, unless the body pauses longer than ``timeout_s`` or falls
        behind its deadline (``timeout_s`` + one second per ``min_rate`` bytes): _Slow."""
        wait = min(self.timeout_s, self.timeout_s + self.raw / self.min_rate - self.elapsed())
        if wait <= 0:
            raise _Slow
        try:
            async with asyncio.timeout(wait):  # (cancels only the server's wait for bytes)
                return await receive()
        except TimeoutError:
            raise _Slow from None

    def hold(self, n: int) -> None:
        if not self.budget.take(n):
            raise _Busy
        self.held += n

    def release(self) -> None:
        self.budget.give(self.held)
        self.held = 0

    async def read(self, receive: Receive) -> bytes:
        parts: list[bytes] = []
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if self.gzipped else None
        more = True
        while more:
            message = await self._next(receive)
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            self.raw += len(chunk)
            if self.raw > self.max_bytes:  # (plain or compressed: no bigger than the cap)
                raise _TooLarge
            if inflater is None:
                self._add(parts, chunk)
                continue
            while chunk:
                if inflater.eof:  # another gzip member follows (gzip.decompress reads on)
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                # a bounded piece per call: zlib builds its output in blocks and then
                # copies them into one bytes, so one call inflating 64 MiB would peak at 128
                room = min(INFLATE_STEP, self.max_bytes - self.size + 1)
                out = inflater.decompress(chunk, room)
                self._add(parts, out)  # raises once past the cap: never more is inflated
                chunk = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
        if inflater is not None and not inflater.eof and self.raw:
            raise zlib.error("truncated gzip stream")
        return b"".join(parts)

    def _add(self, parts: list[bytes], data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self.size > self.max_bytes:
            raise _TooLarge
        self.hold(len(data))
        parts.append(data)
