"""The trajectory API's access rules, decided without a server (the attacks themselves
are in tests/integration/test_trajectory_security*.py)."""

from __future__ import annotations

import argparse

import pytest

from producers.trajectory_api.access import (
    AccessMiddleware,
    _loopback_name,
    check_token,
    is_loopback,
)
from runwatch.cli.serve import byte_size

TOKEN = "a-token-of-some-length-0123"


def decide(
    path: str = "/status", token: str | None = None, origins: tuple[str, ...] = (), **headers: str
) -> int | None:
    """The refusal's status code for a request with ``headers`` (None: let through)."""
    guard = AccessMiddleware(app=None, token=token, allowed_origins=origins)  # type: ignore[arg-type]
    raw = [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    refusal = guard.refusal({"type": "http", "path": path, "headers": raw})
    return None if refusal is None else refusal.status_code


def test_loopback_names() -> None:
    for host in (b"127.0.0.1:8000", b"localhost", b"LOCALHOST:1", b"[::1]:8000", b"10.1.2.3"):
        assert _loopback_name(host), host
    for host in (b"evil.example", b"evil.example:8000", b"127.0.0.1.nip.io", b"[zz]:1"):
        assert not _loopback_name(host), host
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::")


def test_browser_requests_need_an_allowed_origin() -> None:
    host = "127.0.0.1:8000"
    assert decide(host=host) is None  # a plain client
    assert decide(host=host, origin="https://evil.example") == 403
    assert decide(host=host, sec_fetch_site="cross-site") == 403
    assert decide(host=host, sec_fetch_site="same-site") == 403
    assert decide(host=host, sec_fetch_site="same-origin") is None
    assert decide(host=host, sec_fetch_site="none") is None  # typed into the address bar
    assert decide(host=host, origin=f"http://{host}") is None  # its own page (/docs)
    ok = ("http://localhost:5173",)
    assert decide(host=host, origins=ok, origin="http://LOCALHOST:5173") is None
    assert decide(host=host, origins=ok, origin="http://localhost:5174") == 403
    assert decide(host="evil.example:8000") == 403  # rebinding, without a token
    assert decide(host="evil.example:8000", token=TOKEN, authorization=f"Bearer {TOKEN}") is None


def test_the_token() -> None:
    assert decide(token=TOKEN) == 401
    assert decide(token=TOKEN, authorization=f"Bearer {TOKEN}x") == 401
    assert decide(token=TOKEN, authorization=f"Basic {TOKEN}") == 401
    assert decide(token=TOKEN, authorization=f"BEARER {TOKEN}") is None
    assert decide("/health", token=TOKEN) is None
    assert decide("/health/x", token=TOKEN) == 401
    # a foreign page is refused before the token is even looked at
    assert decide(token=TOKEN, authorization=f"Bearer {TOKEN}", origin="http://x.example") == 403
    assert check_token(f"  {TOKEN}\n") == TOKEN
    for weak in ("short", "", "sixteen chars with spaces"):
        with pytest.raises(ValueError):
            check_token(weak)


def test_byte_sizes() -> None:
    assert [byte_size(t) for t in ("65536", "64K", "64M", "64MiB", "1g", "2MB")] == [
        65536, 64 << 10, 64 << 20, 64 << 20, 1 << 30, 2 << 20,
    ]  # fmt: skip
    for bad in ("", "M", "-1", "0", "1.5M", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            byte_size(bad)
