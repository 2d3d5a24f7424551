"""The notifier host in-process, against real HTTP receivers on 127.0.0.1: what it does
with Retry-After, redirects, refused connections and an edited keys file."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import itertools
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from events import NotificationAbandoned, NotificationAttempted, NotificationDelivered
from events.log.embedded import EmbeddedLog
from runwatch import webhook_guard
from runwatch.notifier import Notifier, NotifierSettings, WebhookBook
from runwatch.notifier_receiver import Received, WebhookReceiver
from runwatch.webhook_guard import public_only_transport
from stream_processors.notify import NotifierFold, NotifyPolicy, attempt_event
from tests.integration.test_notifier import SECRETS, keys_file, notifications, state_change

pytestmark = pytest.mark.timeout(60)

FAST = NotifyPolicy(max_attempts=3, backoff_base_s=0.1, backoff_factor=1.0, jitter=0.0)


async def run_until(notifier: Notifier, done: Callable[[], bool], timeout: float = 15.0) -> None:
    stop = asyncio.Event()
    await notifier.backend.start()
    task = asyncio.create_task(notifier.run(stop))
    end = time.monotonic() + timeout
    try:
        while not done():
            assert not task.done(), task.exception()
            assert time.monotonic() < end, notifier.stats
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
        await notifier.backend.close()


def attempts(log: Path) -> list[NotificationAttempted]:
    return [e for e in notifications(log) if isinstance(e, NotificationAttempted)]


def setup(
    tmp_path: Path, urls: dict[str, str], policy: NotifyPolicy = FAST, allow_private: bool = True
) -> Notifier:
    """A notifier on ``tmp_path``; ``allow_private``: the receivers here are on loopback."""
    log = tmp_path / "log"
    keys = keys_file(tmp_path, urls)
    settings = NotifierSettings(
        state_path=tmp_path / "state.json", reload_every_s=0.05, allow_private=allow_private
    )
    return Notifier(EmbeddedLog(log), WebhookBook(keys), policy=policy, settings=settings)


def append(tmp_path: Path, *events) -> None:  # type: ignore[no-untyped-def]
    w = EmbeddedLog(tmp_path / "log")
    w.open_sync()
    w.append_events_sync(events)


async def test_retry_after_is_waited_and_redirects_are_not_followed(tmp_path: Path) -> None:
    def answer(rec: Received) -> int | tuple[int, dict[str, str]]:
        if rec.path == "/moved":
            return 301, {"Location": "http://127.0.0.1:1/elsewhere"}
        return (503, {"Retry-After": "1"}) if rec.attempt == 1 else 200

    secrets = {"/hook": SECRETS["acme"], "/moved": SECRETS["globex"]}
    with WebhookReceiver(secrets=secrets, answer=answer) as rx:
        n = setup(tmp_path, {"acme": rx.url("/hook"), "globex": rx.url("/moved")})
        append(tmp_path, state_change("acme", "r1"), state_change("globex", "r2"))
        await run_until(n, lambda: n.stats.delivered == 1 and n.stats.abandoned == 1)
    acme = [a for a in attempts(tmp_path / "log") if a.tenant_id == "acme"]
    assert [(a.status_code, a.retry_after_s) for a in acme] == [(503, 1.0), (200, None)]
    assert acme[1].ts - acme[0].ts >= 0.95  # Retry-After beat the 0.1 s backoff
    moved = [a for a in attempts(tmp_path / "log") if a.tenant_id == "globex"]
    assert [a.status_code for a in moved] == [301, 301, 301]
    assert all(r.path in ("/hook", "/moved") for r in rx.received)  # never followed


async def test_refused_connections_are_recorded_and_retried(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    n = setup(tmp_path, {"acme": f"http://127.0.0.1:{port}/hook"})
    append(tmp_path, state_change("acme", "r1"))
    await run_until(n, lambda: n.stats.abandoned == 1)
    tries = attempts(tmp_path / "log")
    assert [a.attempt for a in tries] == [1, 2, 3]
    assert all(a.status_code is None and "ConnectError" in a.error for a in tries)


async def test_a_webhook_inside_the_platform_network_is_never_contacted(tmp_path: Path) -> None:
    """A tenant's webhook on a loopback, private or link-local address (the cloud metadata
    service, a service on the platform's network) gets no POST: each attempt fails with the
    reason, no connection is made, and the notification is abandoned as usual. The same
    receiver gets the POST once an operator allows private webhooks."""
    with WebhookReceiver(secrets={"/hook": SECRETS["acme"]}) as rx:
        urls = {
            "acme": rx.url("/hook"),  # 127.0.0.1: a real receiver, listening
            "globex": rx.url("/hook").replace("127.0.0.1", "localhost"),  # a name for it
            "initech": "http://169.254.169.254/latest/meta-data/",
        }
        n = setup(tmp_path, urls, allow_private=False)
        append(tmp_path, *(state_change(t, f"{t}-1") for t in urls))
        await run_until(n, lambda: n.stats.abandoned == 3)
        assert rx.received == []  # nothing reached the listening receiver
        tries = attempts(tmp_path / "log")
        assert len(tries) == 9 and all(a.status_code is None for a in tries)
        assert all("non-public address" in a.error for a in tries)
        assert all(a.duration_ms < 1000 for a in tries)  # refused, not timed out
    (tmp_path / "allowed").mkdir()
    with WebhookReceiver(secrets={"/hook": SECRETS["acme"]}) as rx:
        n = setup(tmp_path / "allowed", {"acme": rx.url("/hook")}, allow_private=True)
        append(tmp_path / "allowed", state_change("acme", "acme-1"))
        await run_until(n, lambda: n.stats.delivered == 1)
        assert [r.path for r in rx.received] == ["/hook"]


async def test_the_client_connects_only_to_the_address_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: a name that resolves to a public address when the attempt is checked
    and to a private one when the client connects. The notifier's own HTTP client resolves
    at connect time and connects to the address it checked: refused, nothing received.
    Control: with loopback counted as public, the same client delivers through the pinned
    address (the request keeps its host name)."""
    answers = iter(["8.8.8.8", "127.0.0.1"] * 10)  # check, connect, check, connect ...

    async def rebinding(self, host, port, **kw):  # type: ignore[no-untyped-def]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    with WebhookReceiver(secrets={"/hook": SECRETS["acme"]}) as rx:
        url = rx.url("/hook").replace("127.0.0.1", "rebind.example")
        with monkeypatch.context() as m:
            m.setattr(asyncio.BaseEventLoop, "getaddrinfo", rebinding)
            n = setup(tmp_path, {"acme": url}, allow_private=False)
            append(tmp_path, state_change("acme", "acme-1"))
            await run_until(n, lambda: n.stats.abandoned == 1)
        tries = attempts(tmp_path / "log")
        assert len(tries) == 3 and rx.received == []
        assert all("ConnectError" in a.error and "(127.0.0.1)" in a.error for a in tries)

        m2 = pytest.MonkeyPatch()
        m2.setattr(webhook_guard, "refused_address", lambda address: False)
        try:
            limits = httpx.Limits(max_connections=2)
            async with httpx.AsyncClient(transport=public_only_transport(limits)) as client:
                resp = await client.post(rx.url("/hook").replace("127.0.0.1", "localhost"))
        finally:
            m2.undo()
        assert resp.status_code in (200, 400, 401) and [r.path for r in rx.received] == ["/hook"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for a test cert")
async def test_the_pinned_client_still_verifies_tls_against_the_host_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connecting to the checked address must not weaken TLS: a real HTTPS server with a
    certificate for ``localhost`` is reached as ``https://localhost`` (the name verified,
    the pinned address connected), and refused as ``https://127.0.0.1`` (not its name)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    monkeypatch.setattr(webhook_guard, "refused_address", lambda address: False)
    trusting = ssl.create_default_context(cafile=str(cert))
    monkeypatch.setattr(httpx, "create_ssl_context", lambda *a, **k: trusting)
    try:
        limits = httpx.Limits(max_connections=2)
        async with httpx.AsyncClient(transport=public_only_transport(limits)) as client:
            resp = await client.post(f"https://localhost:{port}/hook", content=b"{}")
            assert resp.status_code == 200
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.post(f"https://127.0.0.1:{port}/hook", content=b"{}")
    finally:
        server.shutdown()


async def test_an_edited_keys_file_applies_without_a_restart(tmp_path: Path) -> None:
    with WebhookReceiver(secrets={"/acme": SECRETS["acme"], "/g": b"g" * 20}) as rx:
        n = setup(tmp_path, {"acme": rx.url("/acme")})
        before = state_change("globex", "g1")  # globex has no webhook yet: not queued
        after = state_change("globex", "g2")
        append(tmp_path, state_change("acme", "a1"), before)
        keys = tmp_path / "keys.yaml"
        phase = ["start"]

        def step() -> bool:  # called while the notifier runs
            if phase[0] == "start" and n.stats.delivered == 1:
                doc = yaml.safe_load(keys.read_text())
                doc["tenants"]["globex"] = {"webhook": {"url": rx.url("/g"), "secret": "g" * 20}}
                keys.write_text(yaml.safe_dump(doc))
                phase[0] = "edited"
            elif phase[0] == "edited" and "globex" in n.book.hooks:
                append(tmp_path, after)  # after the reload
                phase[0] = "appended"
            return n.stats.delivered == 2

        await run_until(n, step)
    delivered = {e.notification_id for e in notifications(tmp_path / "log")
                 if isinstance(e, NotificationDelivered)}  # fmt: skip
    assert str(after.event_id) in delivered and str(before.event_id) not in delivered
    assert [r.delivery_id for r in rx.received if r.path == "/g"] == [str(after.event_id)]
    assert all(r.valid for r in rx.received)


async def test_a_restart_learns_what_its_predecessor_recorded_before_sending(
    tmp_path: Path,
) -> None:
    """A killed notifier recorded attempt 1 after its last save; its successor reads one
    record per poll here, so it would be tempted to send attempt 1 again after the first.
    It sends nothing until it has read up to where the log ended when it started."""
    with WebhookReceiver(secrets={"/acme": SECRETS["acme"]}) as rx:
        n = setup(tmp_path, {"acme": rx.url("/acme")})
        n.settings.poll_records = 1
        sc = state_change("acme", "r1")
        pending = NotifierFold(FAST).apply(NotifierFold(FAST).initial(), sc)[0].pending[0]
        first = attempt_event(pending, 1, ts=time.time() - 5, ok=False, status_code=500)
        append(tmp_path, sc, first)
        await run_until(n, lambda: n.stats.delivered == 1)
    assert [r.attempt for r in rx.received] == [2]
    assert [(a.attempt, a.ok) for a in attempts(tmp_path / "log")] == [(1, False), (2, True)]


class DripServer:
    """A real socket server on 127.0.0.1 that answers one notification (``stuck``, an
    ``X-Runwatch-Delivery`` id) a byte every ``every_s`` and never finishes, and every other
    one with ``200`` at once. ``mode``: ``"status"`` drips the status line and an endless
    header; ``"body"`` sends ``200`` headers at once and then drips an endless body. Each
    byte arrives well inside a per-read timeout: only a deadline on the whole attempt ends
    it. Records when each POST arrived and when the client closed a dripping connection
    (``time.monotonic()``)."""

    def __init__(self, stuck: str, mode: str, every_s: float = 0.05) -> None:
        self.stuck, self.mode, self.every_s = stuck, mode, every_s
        self.posts: list[tuple[str, float]] = []  # (delivery id, arrival)
        self.drips: list[tuple[float, float | None]] = []  # (arrival, client closed at)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/hook"

    def close(self) -> None:
        self._done.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                fields = dict(
                    line.split(": ", 1) for line in head.decode().lower().split("\r\n")[1:]
                )
                while len(body) < int(fields.get("content-length", 0)):
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    body += chunk
            except (OSError, ValueError):
                return
            delivery, arrived = fields.get("x-runwatch-delivery", ""), time.monotonic()
            self.posts.append((delivery, arrived))
            if delivery != self.stuck:
                with contextlib.suppress(OSError):
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                return
            self.drips.append((arrived, None))
            index = len(self.drips) - 1
            if self.mode == "body":  # the headers at once, then an endless body
                sent, drip = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n", b""
            else:  # the status line and then an endless header, all a byte at a time
                sent, drip = b"", b"HTTP/1.1 200 OK\r\nX-Pad: "
            try:
                conn.sendall(sent)
                for i in itertools.count():
                    if self._done.is_set() or time.monotonic() - arrived > 30:
                        break
                    conn.sendall(drip[i : i + 1] or b"a")
                    readable, _, _ = select.select([conn], [], [], self.every_s)
                    if readable and not conn.recv(1):  # the client closed the connection
                        break
            except OSError:  # reset by the client
                pass
            self.drips[index] = (arrived, time.monotonic())


@pytest.mark.parametrize("mode", ["status", "body"])
async def test_a_webhook_that_drips_its_answer_is_timed_out_retried_and_abandoned(
    tmp_path: Path, mode: str
) -> None:
    """An endpoint (or a proxy) that answers a byte at a time, each byte well inside the
    timeout, must not hold a POST open: ``timeout_s`` bounds the whole attempt (connect,
    send, headers, body). The attempt is recorded as a failed one about ``timeout_s``
    after it left, its connection closed; it is retried and abandoned per the policy; and
    meanwhile the run's later notification (its ``PAUSED_BY_GATE`` state change) and the
    tenant's other run are delivered: no run and no tenant slot is stuck behind it."""
    first = state_change("acme", "r1")
    paused = state_change("acme", "r1", to="PAUSED_BY_GATE")
    other = state_change("acme", "r2")
    server = DripServer(stuck=str(first.event_id), mode=mode)
    try:
        n = setup(tmp_path, {"acme": server.url()})
        n.settings.timeout_s = 1.0
        n.settings.per_tenant_in_flight = 1  # the drip must not keep the tenant's only slot
        append(tmp_path, first, paused, other)
        t0 = time.monotonic()
        await run_until(n, lambda: n.stats.abandoned == 1 and n.stats.delivered == 2)
        elapsed = time.monotonic() - t0
    finally:
        server.close()
    assert not n._tasks  # no delivery left running
    events = notifications(tmp_path / "log")
    tries = [a for a in attempts(tmp_path / "log") if a.notification_id == str(first.event_id)]
    assert [(a.attempt, a.ok, a.status_code) for a in tries] == [
        (i, False, None) for i in (1, 2, 3)
    ]
    assert all(a.error.startswith("timeout: no complete answer within 1 s") for a in tries), tries
    # recorded about timeout_s after the POST left, not after the drip would have ended
    assert all(950 <= a.duration_ms < 2000 for a in tries), [a.duration_ms for a in tries]
    # the client hung up each dripping connection at its deadline (closed, not leaked)
    assert len(server.drips) == 3
    assert all(
        closed is not None and 0.5 <= closed - arrived < 2.0 for arrived, closed in server.drips
    )
    abandoned = [e for e in events if isinstance(e, NotificationAbandoned)]
    assert [e.notification_id for e in abandoned] == [str(first.event_id)]
    assert "last: timeout: no complete answer within 1 s" in abandoned[0].reason
    delivered = {e.notification_id for e in events if isinstance(e, NotificationDelivered)}
    assert delivered == {str(paused.event_id), str(other.event_id)}
    # the run's PAUSED_BY_GATE change went out between the stuck one's attempts
    first_drip = server.drips[0][0]
    paused_at = next(t for d, t in server.posts if d == str(paused.event_id))
    assert paused_at - first_drip < 2.5, paused_at - first_drip  # ~1 s
    assert elapsed < 8.0, elapsed  # 3 attempts of 1 s + backoffs
