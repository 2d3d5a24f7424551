"""Inflate gzip request bodies (``Content-Encoding: gzip``), as Atropos clients send them.

A pure ASGI middleware: the body is read whole, inflated, and handed on with the
encoding header removed and ``content-length`` corrected. A body that is not valid gzip
is a 400 ``Invalid gzip payload`` (the reference server's answer); one that inflates
beyond ``max_bytes`` is a 413 (a small gzip must not become an out-of-memory).
"""

from __future__ import annotations

import zlib
from typing import Any

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class GzipRequestMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int = 1 << 30) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        encoding = next((v for k, v in headers if k == b"content-encoding"), b"")
        if b"gzip" not in encoding.lower():
            await self.app(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = self._inflate(raw) if raw else b""
        except zlib.error:
            await PlainTextResponse("Invalid gzip payload", status_code=400)(scope, receive, send)
            return
        except OverflowError:
            text = f"gzip body inflates beyond {self.max_bytes} bytes"
            await PlainTextResponse(text, status_code=413)(scope, receive, send)
            return
        new_headers = [
            (k, v) for k, v in headers if k not in (b"content-encoding", b"content-length")
        ]
        new_headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def inflated_receive() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # the disconnect, when it comes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        inner: dict[str, Any] = {**scope, "headers": new_headers}
        await self.app(inner, inflated_receive, send)

    def _inflate(self, raw: bytes) -> bytes:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = d.decompress(raw, self.max_bytes + 1)
        if len(out) > self.max_bytes or d.unconsumed_tail:
            raise OverflowError
        if not d.eof:
            raise zlib.error("truncated gzip stream")
        return out
