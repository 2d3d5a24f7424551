"""The typed RPC boundary between the host and a sandbox worker (host side).

Wire format: frames over a UNIX stream socketpair, each a 4-byte big-endian length then that
many bytes of UTF-8 JSON (one object). JSON, never pickle: nothing the tenant sends can make
the host execute code. The worker's side of this format lives in
``sandbox/runtime/worker_main.py`` (stdlib only, since it runs inside the sandbox).

Messages (``op`` field):

=========== ======== =============================================================
op          dir      fields
=========== ======== =============================================================
hello       w -> h   (none) — interpreter up, limits applied, tenant code not loaded
go          h -> w   (none) — host has recorded the worker's process baseline
ready       w -> h   (none) — tenant artifact imported, ``reward`` is callable
load_error  w -> h   kind ("crash" | "resource" | "bad_output"), message
score       h -> w   id (int), batch (list of {prompt, completion, ...})
result      w -> h   id, scores (whatever the tenant returned; judged by the gate)
error       w -> h   id, kind ("crash" | "resource" | "bad_output"), message
=========== ======== =============================================================

Everything received from a worker is tenant-controlled: :func:`recv_frame` bounds the size
before reading and accepts only a JSON object with an ``op``; anything else is a
``tenant_bad_output``; the text of an ``error``/``load_error`` is cleaned
(:func:`error_message`). What the host sends is checked whole before it is sent
(:mod:`sandbox.batch`), so a send can fail only because the worker is gone.
Time: ``deadline`` arguments are absolute ``time.monotonic()`` values. A ``watch`` given
to :func:`recv_frame` is called at least every :data:`WATCH_EVERY_S` of the wait (bytes
arriving or not: a tenant cannot hold it off by writing a byte at a time); when it
answers True the wait ends with :attr:`RecvError.CUT` (the host's CPU budget).
"""

from __future__ import annotations

import enum
import json
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox.text import clean_text

HEADER = struct.Struct(">I")
#: A frame this small fits an empty UNIX socket's send buffer (~208 KiB by default):
#: sending it never waits for the reader.
NEVER_BLOCKS = 64 * 1024
#: How often a receive's ``watch`` is asked whether to give up the wait.
WATCH_EVERY_S = 0.1


class RecvError(enum.StrEnum):
    TIMEOUT = "timeout"
    EOF = "eof"
    OVERSIZE = "oversize"
    MALFORMED = "malformed"
    CUT = "cut"  # the caller's watch ended the wait (the worker's CPU budget is spent)


@dataclass(frozen=True, slots=True)
class Frame:
    """A received message, or the reason none arrived."""

    message: dict[str, Any] | None
    error: RecvError | None = None
    detail: str = ""


def encode_frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    return HEADER.pack(len(body)) + body


def send_frame(
    sock: socket.socket,
    message: dict[str, Any],
    deadline: float,
    before_blocking: Callable[[], None] | None = None,
) -> str | None:
    """Send one frame; returns None or the error text (never raises).

    ``before_blocking`` runs before a send that may have to wait for the reader (a frame
    larger than :data:`NEVER_BLOCKS`), else right after the frame was sent: the host
    continues a stopped worker with it, once, when the batch is already there to read."""
    try:
        data = encode_frame(message)
        late = before_blocking if len(data) <= NEVER_BLOCKS else None
        if before_blocking is not None and late is None:
            before_blocking()
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(data)
        if late is not None:
            late()
        return None
    except (OSError, ValueError, TypeError) as exc:
        if before_blocking is not None:
            before_blocking()  # (again: harmless) never leave a stopped worker stopped
        return f"{type(exc).__name__}: {exc}"


class _Watch:
    """Asks ``check`` at most every :data:`WATCH_EVERY_S` whether to give up a wait."""

    def __init__(self, check: Callable[[], bool] | None) -> None:
        self.check = check
        self.next_at = time.monotonic() + WATCH_EVERY_S

    def timeout(self, remaining: float) -> float:
        """The socket timeout for the next read: never past the next look."""
        if self.check is None:
            return remaining
        return max(0.001, min(remaining, self.next_at - time.monotonic()))

    def cut(self) -> bool:
        """True when the check says stop (asked only once its interval is over)."""
        if self.check is None or time.monotonic() < self.next_at:
            return False
        self.next_at = time.monotonic() + WATCH_EVERY_S
        return bool(self.check())


def _recv_exact(
    sock: socket.socket, n: int, deadline: float, watch: _Watch | None = None
) -> bytes | RecvError:
    watch = watch or _Watch(None)
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return RecvError.TIMEOUT
        sock.settimeout(watch.timeout(remaining))
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            if watch.check is None:
                return RecvError.TIMEOUT
            k = -1  # only the watch's interval ended: look, then wait on
        except OSError:
            return RecvError.EOF
        if k == 0:
            return RecvError.EOF
        if watch.cut():
            return RecvError.CUT
        got += max(0, k)
    return bytes(buf)


def recv_frame(
    sock: socket.socket,
    deadline: float,
    max_bytes: int,
    watch: Callable[[], bool] | None = None,
) -> Frame:
    """Receive one frame before ``deadline``, refusing bodies over ``max_bytes`` unread.

    ``watch`` (optional) is asked every :data:`WATCH_EVERY_S` of the wait; True ends it
    with :attr:`RecvError.CUT`."""
    looks = _Watch(watch)
    head = _recv_exact(sock, HEADER.size, deadline, looks)
    if isinstance(head, RecvError):
        return Frame(None, head)
    (length,) = HEADER.unpack(head)
    if length > max_bytes:
        return Frame(None, RecvError.OVERSIZE, f"reply of {length} bytes > cap {max_bytes}")
    body = _recv_exact(sock, length, deadline, looks)
    if isinstance(body, RecvError):
        return Frame(None, body)
    try:
        msg = json.loads(body.decode("utf-8"))  # NaN/Infinity parse; the gate rejects them
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return Frame(None, RecvError.MALFORMED, f"reply is not JSON: {exc}"[:300])
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        return Frame(None, RecvError.MALFORMED, "reply is not an object with an 'op'")
    return Frame(msg)


ERROR_KINDS = frozenset({"crash", "resource", "bad_output"})


def error_kind(msg: dict[str, Any]) -> str:
    kind = msg.get("kind")
    return kind if isinstance(kind, str) and kind in ERROR_KINDS else "crash"


def error_message(msg: dict[str, Any], limit: int = 2000) -> str:
    """The worker's error text, cleaned (:func:`sandbox.text.clean_text`: bounded, valid
    UTF-8, no terminal or bidi controls): it is whatever tenant code raised."""
    text = msg.get("message")
    return clean_text(text, limit) if isinstance(text, str) else ""
