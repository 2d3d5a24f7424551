"""The red team's query API findings, on real ``runwatch serve`` processes over real
sockets (and the follower's retry and death on the real app in-process):

- idle and slow connections: beyond ``--limit-concurrency`` a connection is closed at
  once, one that does not complete a request's headers within ``--header-timeout-s`` is
  closed (idle or slowloris), header bytes are capped (431); the follower keeps folding
  throughout, and when descriptors do run out (a cap set too high) it fails, says so,
  retries and recovers; ``/healthz`` answers 503 while it is stalled or after it stopped;
- bodies: a request with a body and no valid key is answered 401 before any body byte is
  sent; a body over 64 KiB is 413 (declared or streamed); valid commands are unchanged;
- commands: events name the operator key's entry; each principal's commands are
  rate-limited (429 with Retry-After), so refusals stop reaching the control topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from events.catalog.control import CommandRejected, PauseRequested
from events.log.embedded import EmbeddedLog
from projections.api import create_app
from projections.keys import ApiKeys, digest
from projections.sqlite_store import SqliteReadModel
from runwatch.apps.query_api import start_follower
from runwatch.hosting.read_model import read_model_host
from tests.integration.test_run_control import _events
from tests.projection_runs import RunFactory, synth_fleet, write_log

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "runwatch.cli.main"]
T0, T1, OPS, OPS2 = "k-tenant-0-aaaa", "k-tenant-1-bbbb", "k-ops-alice-cccc", "k-ops-dddd"
KEYS = {
    "keys": [
        {"key": T0, "tenant": "tenant-0"},
        {"key": T1, "tenant": "tenant-1"},
        {"key": OPS, "operator": True, "name": "alice"},
        {"sha256": digest(OPS2), "operator": True},
    ]
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _add_run(log: Path, run_id: str, tenant: str = "tenant-0") -> None:
    """A run that started and made three steps (RUNNING), appended to the log."""
    f = RunFactory(run_id, tenant, 1.8e9)
    events = f.start()
    for step in range(1, 4):
        events += f.step(step)
    writer = EmbeddedLog(log, sync=False)
    writer.open_sync()
    write_log(writer, events)


def _make_log(root: Path) -> tuple[Path, Path]:
    log, keys = root / "log", root / "keys.yaml"
    writer = EmbeddedLog(log, sync=False)
    writer.open_sync()
    write_log(writer, synth_fleet(4, 10, tenants=2))  # run-0000: tenant-0's, ended
    keys.write_text(yaml.safe_dump(KEYS))
    return log, keys


def _assert_capped_then_closed(
    idle: list[socket.socket], over_cap: int, server: Server | None = None
) -> None:
    """At least ``over_cap`` of the ``idle`` connections are closed at once (beyond the
    cap), and all of them within 5 s more (the header timeout)."""
    assert _wait(lambda: sum(map(_closed_by_server, idle)) >= over_cap, "the cap", 5, server)
    started = time.monotonic()
    _wait(lambda: all(map(_closed_by_server, idle)), "idle connections closed", 10)
    assert time.monotonic() - started < 5


def _wait(fn: Callable[[], Any], what: str, timeout: float = 20.0, server: Server | None = None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server is not None:
            assert server.proc.poll() is None, f"server exited:\n{server.stderr()}"
        with contextlib.suppress(httpx.HTTPError, OSError):
            got = fn()
            if got:
                return got
        time.sleep(0.05)
    raise AssertionError(
        f"timed out waiting for {what}" + (f":\n{server.stderr()}" if server else "")
    )


class Server:
    def __init__(self, proc: subprocess.Popen, err: Path, port: int, log: Path | None) -> None:
        self.proc, self.err, self.port, self.log = proc, err, port, log
        self.base = f"http://127.0.0.1:{port}"

    def stderr(self) -> str:
        return self.err.read_text()

    def get(self, path: str, key: str | None = None) -> httpx.Response:
        return httpx.get(self.base + path, headers={"X-API-Key": key} if key else {}, timeout=10)

    def raw(self, request: bytes, timeout: float = 5.0) -> bytes:
        """Send ``request`` (bytes as given) on a new connection; the reply (its head and
        ``Content-Length`` bytes of body), however the server's writes were split."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(request)
            reply = b""
            while b"\r\n\r\n" not in reply or len(reply) < _reply_length(reply):
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
            return reply


def _reply_length(reply: bytes) -> int:
    head, _, _ = reply.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(head) + 4


@contextlib.contextmanager
def serve(tmp: Path, args: list[str], nofile: int | None = None) -> Iterator[Server]:
    """A ``runwatch serve ...`` process (``args`` after ``serve``), optionally under an
    open-files limit (soft = hard = ``nofile``), waited for until it answers."""
    port = _port()
    err = tmp / f"stderr-{port}.txt"

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [*CLI, "serve", *args, "--port", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=limit,
        )
    server = Server(proc, err, port, None)
    health = "/health" if args[0] == "trajectories" else "/healthz"
    try:
        _wait(lambda: server.get(health).status_code == 200, "the server", 60, server)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_api(tmp: Path, *extra: str, nofile: int | None = None):  # type: ignore[no-untyped-def]
    log, keys = _make_log(tmp)
    args = ["api", "--log", str(log), "--keys", str(keys), "--store", str(tmp / "view.sqlite")]
    return serve(tmp, [*args, "--settle-s", "0.2", *extra], nofile)


def _closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


# -- connections and the follower --------------------------------------------------------


def test_idle_and_slow_connections_are_closed_and_the_follower_keeps_folding(tmp_path):
    with serve_api(tmp_path, "--header-timeout-s", "1", nofile=256) as server:
        # the open-files limit could not be raised (hard = soft): the cap is fitted under it
        assert "open files limit: 256" in server.stderr()
        assert "connections: at most 128; request headers within 1 s" in server.stderr()
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
        try:
            _add_run(tmp_path / "log", "late-run")
            # beyond the cap: closed at once; the rest: once the header timeout passes
            _assert_capped_then_closed(idle, 300 - 128, server)
        finally:
            for s in idle:
                s.close()
        # the follower went on: the run appended during the flood is served
        _wait(lambda: server.get("/v1/runs/late-run", T0).status_code == 200, "late-run")
        assert server.get("/healthz").json() == {"status": "ok"}

        # slowloris: a header line every 0.2 s never completes the headers
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            started, closed = time.monotonic(), False
            while time.monotonic() - started < 6 and not closed:
                time.sleep(0.2)
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    closed = True
                else:
                    closed = _closed_by_server(s)
                    s.setblocking(True)
            assert closed and 0.8 < time.monotonic() - started < 3
        # unbounded headers: 431 once they pass 64 KiB
        reply = server.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * (100 << 10))
        assert reply.startswith(b"HTTP/1.1 431 ")
        # a keep-alive client is not disturbed
        with httpx.Client(base_url=server.base) as client:
            assert client.get("/healthz").status_code == 200
            time.sleep(0.3)
            assert client.get("/v1/runs", headers={"X-API-Key": T0}).status_code == 200
        assert "follower failed" not in server.stderr()


def test_the_follower_retries_when_descriptors_run_out(tmp_path):
    """The red team's repro, with the cap set (on purpose) above what the limit allows."""
    extra = ("--limit-concurrency", "5000", "--follower-stall-s", "2")
    with serve_api(tmp_path, *extra, nofile=256) as server:
        assert "idle connections can starve the server" in server.stderr()
        held: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 20
            while "follower failed" not in server.stderr() and time.monotonic() < deadline:
                for _ in range(50):  # no bytes, no key: just descriptors
                    held.append(socket.create_connection(("127.0.0.1", server.port)))
                time.sleep(0.05)
            assert "OSError(24, 'Too many open files')" in server.stderr()
            assert "retrying in" in server.stderr()
        finally:
            for s in held:
                s.close()
        _add_run(tmp_path / "log", "after-run")
        _wait(lambda: "projection follower recovered" in server.stderr(), "the recovery")
        _wait(lambda: server.get("/v1/runs/after-run", T0).status_code == 200, "after-run")
        assert server.get("/healthz").json() == {"status": "ok"}


def test_healthz_is_503_while_the_follower_is_stalled(tmp_path):
    with serve_api(tmp_path, "--follower-stall-s", "1") as server:
        store = sqlite3.connect(tmp_path / "view.sqlite", isolation_level=None)
        store.execute("BEGIN IMMEDIATE")  # the follower's next commit waits on this
        try:
            _add_run(tmp_path / "log", "blocked-run")
            r = _wait(lambda: (r := server.get("/healthz")).status_code == 503 and r, "503")
            body = r.json()
            assert body["status"] == "unavailable"
            assert body["reason"].startswith("projection follower stalled: no progress for")
            assert server.get("/v1/runs", T0).status_code == 200  # the last commit is served
        finally:
            store.execute("ROLLBACK")
            store.close()
        _wait(lambda: server.get("/healthz").status_code == 200, "healthz 200 again")
        _wait(lambda: server.get("/v1/runs/blocked-run", T0).status_code == 200, "the run")


class _Broken:
    """A log backend whose ``start`` raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def start(self) -> None:
        raise self.exc

    async def close(self) -> None:
        return None


def test_a_transient_error_is_retried_and_a_dead_follower_is_a_503(tmp_path):
    log, _ = _make_log(tmp_path)
    _add_run(log, "live-run")
    store_path = tmp_path / "p.sqlite"
    said: list[str] = []
    backends = iter([_Broken(OSError(24, "Too many open files"))])

    def open_backend() -> Any:
        return next(backends, None) or EmbeddedLog(log, readonly=True)

    def open_host() -> Any:
        return read_model_host(SqliteReadModel(store_path))

    store = SqliteReadModel(store_path)  # first: two connections must not race to make it
    follower = start_follower(
        open_backend, open_host, 0.2, False, "g", said.append, said.append, retry_s=(0.05, 0.1)
    )
    client = TestClient(
        create_app(store, ApiKeys.from_mapping(KEYS), health=follower.health.problem)
    )
    try:
        _wait(lambda: store.get_run("live-run") is not None, "the follower to fold")
        assert said[0] == (
            "projection follower failed (attempt 1): OSError(24, 'Too many open files'); "
            "retrying in 0.05 s"
        )
        _wait(lambda: "projection follower recovered" in said, "the recovery")
        assert client.get("/healthz").json() == {"status": "ok"}
    finally:
        follower.stop()
        follower.thread.join(10)

    # something that is not an Exception ends the follower: /healthz says so
    dead = start_follower(
        lambda: _Broken(asyncio.CancelledError()), open_host, 0.2, False, "g", said.append
    )
    dead.thread.join(10)
    client = TestClient(create_app(store, ApiKeys.from_mapping(KEYS), health=dead.health.problem))
    r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json() == {
        "status": "unavailable",
        "reason": "projection follower stopped: the views are no longer updated",
    }
    assert said[-1] == "projection follower stopped: CancelledError()"


def test_the_trajectory_api_closes_idle_connections_too(tmp_path):
    args = ["trajectories", "--log", str(tmp_path / "log"), "--state-dir", "none"]
    with serve(tmp_path, [*args, "--header-timeout-s", "1", "--limit-concurrency", "50"]) as server:
        assert "connections: at most 50; request headers within 1 s" in server.stderr()
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(60)]
        try:
            _assert_capped_then_closed(idle, 10)
        finally:
            for s in idle:
                s.close()
        assert server.get("/health").status_code == 200


# -- bodies and commands -----------------------------------------------------------------


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("hardening")
    with serve_api(tmp, "--command-burst", "3", "--command-rate", "0.2") as server:
        server.log = tmp / "log"
        _add_run(server.log, "live-run")
        _wait(lambda: server.get("/v1/runs/live-run", T0).status_code == 200, "live-run")
        ended = {"SUCCEEDED", "FAILED", "CANCELLED"}
        for path in ("/v1/runs/run-0000", "/v1/runs/run-0001"):  # once the barrier let go
            _wait(lambda p=path: server.get(p, OPS).json()["state"] in ended, path)
        yield server


def _head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_body_without_a_valid_key_is_refused_before_it_is_read(api):
    huge = "Content-Length: 536870912"  # 512 MiB announced, not a byte of it sent
    for auth in ((), ("X-API-Key: nope",), ("Authorization: Bearer nope",)):
        started = time.monotonic()
        reply = api.raw(_head("/v1/runs/run-0000/cancel", huge, *auth))
        assert reply.startswith(b"HTTP/1.1 401 "), reply
        assert b"www-authenticate: Bearer" in reply
        assert b'{"detail":"missing or invalid API key"}' in reply
        assert time.monotonic() - started < 3
    # a chunked body likewise, and any path (nothing there reads an unknown client's body)
    for path in ("/v1/operator/runs/run-0000/pause", "/nowhere"):
        reply = api.raw(_head(path, "Transfer-Encoding: chunked") + b"100000\r\n")
        assert reply.startswith(b"HTTP/1.1 401 "), reply
    # body-less requests are unchanged: the routes' own 401
    r = httpx.post(f"{api.base}/v1/runs/run-0000/cancel")
    assert r.status_code == 401 and r.json() == {"detail": "missing or invalid API key"}


def test_bodies_over_64_kib_are_413_and_valid_bodies_are_unchanged(api):
    key = f"X-API-Key: {T0}"
    reply = api.raw(_head("/v1/runs/run-0000/cancel", key, "Content-Length: 65537"))
    assert reply.startswith(b"HTTP/1.1 413 "), reply  # before a byte of it was sent

    def chunks() -> Iterator[bytes]:
        yield b'{"reason": "'
        for _ in range(20):
            yield b"x" * 4096

    r = httpx.post(
        f"{api.base}/v1/runs/run-0000/cancel", headers={"X-API-Key": T0}, content=chunks()
    )
    assert r.status_code == 413 and r.json() == {"detail": "request body exceeds 65536 bytes"}
    # within the cap: as before (the validation answers included)
    bad = httpx.post(f"{api.base}/v1/runs/run-0000/resume", headers={"X-API-Key": T0}, json=[1])
    assert bad.status_code == 422
    r = httpx.post(
        f"{api.base}/v1/runs/run-0000/resume",
        headers={"X-API-Key": T0},
        json={"reason": "x" * 500, "overrides": {"lr": 0.001}},
    )
    assert r.status_code == 409 and "ended" in r.text


def test_commands_name_the_operator_and_are_rate_limited(api):
    ops = {"Authorization": f"Bearer {OPS}"}
    r = httpx.post(f"{api.base}/v1/operator/runs/live-run/pause", headers=ops, json={})
    assert r.status_code == 202, r.text
    pause_id = r.json()["command_id"]
    r = httpx.post(f"{api.base}/v1/operator/runs/run-0001/cancel", headers={"X-API-Key": OPS2})
    assert r.status_code == 409  # ended: refused, and recorded as refused by that key

    # tenant-1 floods refused resumes: 3 get through (the burst), then 429
    codes = []
    for _ in range(6):
        r = httpx.post(f"{api.base}/v1/runs/run-0001/resume", headers={"X-API-Key": T1})
        codes.append(r.status_code)
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert "too many commands: at most 3 at once" in r.json()["detail"]
    assert codes == [409, 409, 409, 429, 429, 429]
    # another principal has its own bucket
    r = httpx.post(f"{api.base}/v1/runs/run-0000/resume", headers={"X-API-Key": T0})
    assert r.status_code == 409

    ops_id, ops2_id = digest(OPS)[:12], digest(OPS2)[:12]
    pause = next(e for e in _events(api.log, "live-run") if isinstance(e, PauseRequested))
    assert str(pause.event_id) == pause_id
    assert pause.principal == f"alice (key {ops_id})"
    assert pause.producer == f"operator/alice (key {ops_id})"
    rejected = [e for e in _events(api.log, "run-0001") if isinstance(e, CommandRejected)]
    assert [e.producer for e in rejected] == [f"operator/key {ops2_id}"] + ["customer/tenant-1"] * 3
