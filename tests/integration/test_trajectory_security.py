"""Attacks on the trajectory API, performed for real against ``runwatch serve
trajectories`` processes over real sockets (issue 20, items 8-10), each asserting the
contained outcome: the status code, nothing stored on the log, the server's peak RSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from events.log.embedded import EmbeddedLog

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 4,
    "max_token_len": 64,
    "checkpoint_dir": "/tmp",
    "save_checkpoint_interval": 10,
    "starting_step": 0,
    "num_steps": 100,
}
ENV = {"max_token_length": 64, "desired_name": "math", "weight": 1.0, "group_size": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group(marker: float, size: int = 2, **extra: object) -> dict[str, object]:
    rows = {"tokens": [[1, 2, 3]] * size, "masks": [[-100, 2, 3]] * size}
    return {**rows, "scores": [marker] * size, **extra}


class Server:
    """``runwatch serve trajectories`` as a child process on the embedded log."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.tmp, self.args = tmp, args
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = tmp / "log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "runwatch.cli.main", "serve", "trajectories",
            "--port", str(self.port), "--log", str(self.log_dir), "--state-dir", "none",
            *self.args,
        ]  # fmt: skip

    def start(self) -> Server:
        with open(self.tmp / "server.log", "ab") as err:
            self.proc = subprocess.Popen(
                self.command(), cwd=ROOT, env=self.env, stdout=err, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server did not come up\n{self.output()}")

    def output(self) -> str:
        return (self.tmp / "server.log").read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logged(self, topic: str = "runwatch.trajectories") -> list[str]:
        """The types of the events on ``topic`` (payload records: their scores)."""
        log = EmbeddedLog(self.log_dir, readonly=True)
        values = [json.loads(r.value) for r in log.read_sync(topic)]
        return [v.get("type") or f"payload {v['scores']}" for v in values]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path, "--vocab-size", "1000").start()
    try:
        yield s
    finally:
        s.stop()


@contextlib.contextmanager
def registered_server(tmp: Path, *args: str) -> Iterator[Server]:
    """A server (``args``: its options), its trainer registered with batch_size 4, started."""
    s = Server(tmp, *args).start()
    try:
        assert httpx.post(s.url + "/register", json=REGISTRATION).status_code == 200
        httpx.get(s.url + "/batch")
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module, with ``--vocab-size 1000``."""
    with registered_server(tmp_path_factory.mktemp("registered"), "--vocab-size", "1000") as s:
        yield s


# -- item 10: registrations and groups a trainer cannot use are refused -------------------


def test_bad_registrations_are_refused_and_nothing_is_stored(server: Server) -> None:
    with httpx.Client(base_url=server.url) as c:
        for bad in ({"batch_size": 0}, {"batch_size": -3}, {"max_token_len": 0}):
            r = c.post("/register", json={**REGISTRATION, **bad})
            assert r.status_code == 422, r.text
            (item,) = r.json()["detail"]
            assert (item["type"], item["loc"]) == ("greater_than_equal", ["body", *bad])
        assert c.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
        assert "TrajectoryTrainerRegistered" not in server.logged()

        assert c.post("/register", json=REGISTRATION).status_code == 200
        c.get("/batch")  # starts the trainer
        for bad in ({"group_size": 0}, {"weight": -1.0}, {"min_batch_allocation": 2.0}):
            r = c.post("/register-env", json={**ENV, **bad})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", *bad]
        assert server.logged().count("TrajectoryTrainerRegistered") == 1
        assert "TrajectoryEnvRegistered" not in server.logged()


@pytest.mark.parametrize(
    ("bad", "kind", "loc"),
    [
        ({"masks": [[-100, 2, 3]]}, "length_mismatch", ["masks"]),
        ({"scores": [1.0, 2.0, 3.0]}, "length_mismatch", ["scores"]),
        ({"masks": [[-100, 2, 3], [2, 3]]}, "length_mismatch", ["masks", 1]),
        ({"tokens": [[1, 2, 3], [1, 1000, 3]]}, "token_out_of_range", ["tokens", 1]),
        ({"tokens": [[1, -7, 3], [1, 2, 3]]}, "token_out_of_range", ["tokens", 0]),
        ({"masks": [[-100, 2, 3], [-1, 2, 3]]}, "token_out_of_range", ["masks", 1]),
        ({"env_id": -1}, "greater_than_equal", ["env_id"]),
        ({"env_id": 2**53}, "less_than_equal", ["env_id"]),  # an event's bound (review)
        ({"tokens": [], "masks": [], "scores": []}, "empty_group", ["tokens"]),
        (
            {"tokens": [[1]] * 5, "masks": [[1]] * 5, "scores": [0.0] * 5},
            "group_too_large",
            ["tokens"],
        ),
    ],
)
def test_groups_a_trainer_cannot_use_are_refused(
    registered: Server, bad: dict[str, object], kind: str, loc: list[object]
) -> None:
    """Each malformed group gets 422 with the reason (alone, and as the second of a list:
    the list is all or nothing), and nothing reaches the log."""
    before = registered.logged("runwatch.trajectory-payloads")
    with httpx.Client(base_url=registered.url) as c:
        r = c.post("/scored_data", json=group(1.0, **bad))
        assert r.status_code == 422, r.text
        assert [(d["type"], d["loc"]) for d in r.json()["detail"]] == [(kind, ["body", *loc])]
        r = c.post("/scored_data_list", json=[group(2.0), group(3.0, **bad)])
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", 1, *loc]
        assert registered.logged("runwatch.trajectory-payloads") == before
        # what is left is accepted, stored, and answered as received
        assert c.post("/scored_data", json=group(4.0)).json() == {"status": "received"}
        assert registered.logged("runwatch.trajectory-payloads") == [*before, "payload [4.0, 4.0]"]
        stored = registered.logged().count("ScoredDataGroupStored")
        assert stored == len(before) + 1


# -- item 9: bodies are bounded, inflated or not, one at a time or many at once ----------

MiB = 1 << 20


def peak_rss_reset(pid: int) -> int:
    """The process's current RSS (bytes), its peak (VmHWM) reset to it."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return rss(pid)


def rss(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def gzip_bomb(inflated: int) -> bytes:
    """A gzip body of ``inflated`` bytes of JSON (a list of blanks), about 1/1000 its size."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    blank = b" " * MiB
    parts = [c.compress(b"[")]
    parts += [c.compress(blank) for _ in range(inflated // MiB)]
    return b"".join([*parts, c.compress(b"]"), c.flush()])


def test_gzip_bomb_is_refused_and_never_inflated(server: Server) -> None:
    """0.9 MB of gzip inflating to 900 MiB (the issue's bomb: the server grew from 57 MB
    to 1.9 GB): 413 with a JSON reason, and the server's peak RSS grows by less than the
    64 MiB cap plus slack, because the inflate stops at the cap."""
    assert server.proc is not None
    bomb = gzip_bomb(900 * MiB)
    assert len(bomb) < MiB
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/register", json=REGISTRATION).status_code == 200
        before = peak_rss_reset(server.proc.pid)
        r = c.post(
            "/scored_data_list",
            content=bomb,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        grew = rss(server.proc.pid, "VmHWM") - before
        assert r.status_code == 413, r.text
        assert r.json() == {
            "detail": f"inflated request body exceeds {64 * MiB} bytes; send smaller requests"
        }
        assert grew < 100 * MiB, f"peak RSS grew {grew / MiB:.0f} MiB for a refused bomb"
        # the server is fine, and the connection is still usable afterwards
        assert c.get("/status").json()["queue_size"] == 0
    assert not server.logged("runwatch.trajectory-payloads")


def test_oversized_plain_bodies_are_refused_before_they_are_held(server: Server) -> None:
    """150 MB, declared (refused before a byte is read) and chunked (refused at the cap):
    413 both, and the server's peak RSS stays far below the body."""
    assert server.proc is not None
    body = b"[" + b" " * (150 * MiB) + b"]"
    with httpx.Client(base_url=server.url, timeout=60) as c:
        before = peak_rss_reset(server.proc.pid)
        r = c.post("/scored_data_list", content=body)
        assert r.status_code == 413
        assert r.json()["detail"].startswith(f"request body exceeds {64 * MiB} bytes")
        declared_growth = rss(server.proc.pid, "VmHWM") - before

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(body), MiB):
                yield body[i : i + MiB]

        before = peak_rss_reset(server.proc.pid)
        r = c.post("/scored_data_list", content=chunks())  # no Content-Length: chunked
        assert r.status_code == 413
        chunked_growth = rss(server.proc.pid, "VmHWM") - before
    assert declared_growth < 16 * MiB, f"{declared_growth / MiB:.0f} MiB for a refused body"
    assert chunked_growth < 100 * MiB, f"{chunked_growth / MiB:.0f} MiB for a refused body"
    assert not server.logged("runwatch.trajectory-payloads")


class RawPush:
    """A POST written by hand on a socket, so its body can be held back: its first
    ``sent`` bytes go with the head (which declares the whole length), the rest on
    :meth:`finish`."""

    def __init__(self, port: int, body: bytes, sent: int = MiB) -> None:
        self.body, self.sent = body, sent
        self.sock = socket.create_connection(("127.0.0.1", port))
        head = (
            "POST /scored_data_list HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body[:sent])

    def finish(self) -> None:
        self.sock.sendall(self.body[self.sent :])

    def answer(self, timeout_s: float) -> tuple[int, dict[str, str], bytes] | None:
        """Status, headers and body of the response, or None if none came in time."""
        self.sock.settimeout(timeout_s)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                got = self.sock.recv(65536)
                if not got:
                    raise AssertionError(f"connection closed: {data!r}")
                data += got
        except TimeoutError:
            assert not data
            return None
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(rest) < int(headers["content-length"]):
            rest += self.sock.recv(65536)
        return int(lines[0].split()[1]), headers, rest

    def close(self) -> None:
        self.sock.close()


class ChunkedPush(RawPush):
    """A POST whose body goes in pieces (``Transfer-Encoding: chunked``: no length
    declared, so nothing about it is known before its bytes arrive)."""

    def __init__(self, port: int) -> None:  # (no super: nothing is sent with the head)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(
            b"POST /scored_data_list HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )

    def chunk(self, data: bytes) -> None:
        self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def end(self) -> None:
        self.sock.sendall(b"0\r\n\r\n")


def budget_full(port: int, timeout_s: float = 30) -> None:
    """Wait until the server holds its whole body budget: a push declaring one byte is
    then refused at once (503) before its body is read; until then it waits for that
    byte, and is dropped."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        probe = RawPush(port, b"[", sent=0)
        try:
            got = probe.answer(timeout_s=0.2)
        finally:
            probe.close()
        if got is not None:
            assert got[0] == 503, got
            return
    raise AssertionError("the server never held its whole budget")


def test_body_bytes_are_taken_from_the_budget_as_they_arrive(tmp_path: Path) -> None:
    """Three chunked pushes of 8 MiB fill a 24 MiB budget with what they sent; the next
    MiB of one of them does not fit: 503 + Retry-After mid-body, and its 8 MiB are given
    back, so the other two finish (200). Once they are answered the whole budget is free
    again (a push as large as the cap goes through), and peak RSS stayed far below what
    holding every body would cost."""
    server = Server(tmp_path, "--max-body-bytes", "16M", "--max-inflight-body-bytes", "24M")
    server.start()
    assert server.proc is not None
    pushes: list[RawPush] = []
    try:
        before = peak_rss_reset(server.proc.pid)
        a, b, c = pushes = [ChunkedPush(server.port) for _ in range(3)]
        for p in pushes:
            p.chunk(b"[" + b" " * (MiB - 1))
            for _ in range(7):
                p.chunk(b" " * MiB)
        budget_full(server.port)  # 24 MiB held: every byte the three sent
        assert all(p.answer(timeout_s=0.1) is None for p in pushes)  # all still reading
        a.chunk(b" " * MiB)
        got = a.answer(timeout_s=10)
        assert got is not None, "the push beyond the budget was not answered"
        status, headers, detail = got
        assert (status, headers["retry-after"]) == (503, "1")
        assert b"too many request bytes in flight" in detail
        for p in (b, c):
            p.chunk(b"]")
            p.end()
            got = p.answer(timeout_s=30)
            assert got is not None and got[0] == 200, got
            assert json.loads(got[2]) == {"status": "received", "groups_processed": 0}
        grew = rss(server.proc.pid, "VmHWM") - before
        assert grew < 100 * MiB, f"peak RSS grew {grew / MiB:.0f} MiB"
        body = b"[" + b" " * (16 * MiB - 2) + b"]"
        assert httpx.post(server.url + "/scored_data_list", content=body).status_code == 200
    finally:
        for p in pushes:
            p.close()
        server.stop()


def test_declaring_a_body_and_sending_none_holds_no_budget(tmp_path: Path) -> None:
    """Red-team round (2026-11): two connections that sent only headers declaring a 64
    MiB body held the whole default budget (a declared length was taken up front), so
    every other push got 503 for as long as they stayed. Four such connections now hold
    nothing: pushes, small or as large as the cap, go through meanwhile (the idle ones
    get 408 after the body timeout, ``test_trajectory_redteam.py``)."""
    server = Server(tmp_path, "--max-body-bytes", "16M", "--max-inflight-body-bytes", "32M")
    server.start()
    lorises: list[RawPush] = []
    try:
        lorises = [RawPush(server.port, b" " * (16 * MiB), sent=0) for _ in range(4)]
        small = json.dumps([group(1.0)]).encode()
        for body in (small, b"[" + b" " * (16 * MiB - 2) + b"]", small):
            r = httpx.post(server.url + "/scored_data_list", content=body, timeout=30)
            assert r.status_code == 200, r.text
        assert all(p.answer(timeout_s=0.05) is None for p in lorises)  # still connected
    finally:
        for p in lorises:
            p.close()
        server.stop()


# -- item 8: a token, an origin allow-list, and no browser page can reset the queue -------

TOKEN = "t0k3n-for-the-trajectory-api-7f3a9c"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def serve_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RUNWATCH_TRAJECTORY_TOKEN"} | (env or {})
    cmd = [sys.executable, "-m", "runwatch.cli.main", "serve", "trajectories", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_beyond_loopback_without_a_token_it_refuses_to_start(tmp_path: Path) -> None:
    port = str(free_port())
    for host in ("0.0.0.0", "::"):
        done = serve_command("--host", host, "--port", port, "--log", str(tmp_path / "log"))
        assert done.returncode != 0
        assert f"refusing to serve the trajectory API on {host} without a token" in done.stderr
    weak = tmp_path / "weak"
    weak.write_text("hunter2\n")
    done = serve_command("--host", "0.0.0.0", "--port", port, "--token-file", str(weak))
    assert done.returncode != 0 and "at least 16 characters" in done.stderr
    done = serve_command(
        "--port", port, "--token-file", str(weak), env={"RUNWATCH_TRAJECTORY_TOKEN": TOKEN}
    )
    assert done.returncode != 0 and "give one" in done.stderr
    with socket.socket() as s:  # nothing was left listening
        assert s.connect_ex(("127.0.0.1", int(port))) != 0


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on every interface with a token (from a file), a registered trainer, and
    one group queued."""
    tmp = tmp_path_factory.mktemp("guarded")
    (tmp / "token").write_text(TOKEN + "\n")
    s = Server(tmp, "--host", "0.0.0.0", "--token-file", str(tmp / "token")).start()
    try:
        with httpx.Client(base_url=s.url, headers=BEARER) as c:
            assert c.post("/register", json=REGISTRATION).status_code == 200
            c.get("/batch")
            assert c.post("/scored_data", json=group(1.0)).json() == {"status": "received"}
        yield s
    finally:
        s.stop()


def test_without_the_token_nothing_is_answered_but_health(guarded: Server) -> None:
    """The issue's attack without a browser: GET /reset_data. Refused (401) without the
    token or with a wrong one, as is every other endpoint; the queue is untouched."""
    before = guarded.logged()
    with httpx.Client(base_url=guarded.url) as c:
        assert c.get("/health").status_code == 200  # liveness probes carry no token
        for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": TOKEN}):
            r = c.get("/reset_data", headers=headers)
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert "bearer token" in r.json()["detail"]
        for method, path in [
            ("GET", "/batch"), ("GET", "/status"), ("GET", "/latest_example"), ("GET", "/"),
            ("POST", "/scored_data"), ("POST", "/register"), ("POST", "/register-env"),
        ]:  # fmt: skip
            assert c.request(method, path, json=group(9.0)).status_code == 401, path
        # a body is not even read: a huge one gets the same 401
        r = c.post("/scored_data_list", content=b"[" + b" " * (100 * MiB) + b"]")
        assert r.status_code == 401
    assert guarded.logged() == before  # no reset, no batch request, nothing pushed
    # Atropos clients that send the token work as before (any case of "Bearer")
    with httpx.Client(base_url=guarded.url) as c:
        r = c.get("/status", headers={"Authorization": f"bearer {TOKEN}"})
        assert r.json() == {"current_step": 0, "queue_size": 1}


def test_the_token_can_come_from_the_environment(tmp_path: Path) -> None:
    s = Server(tmp_path, "--host", "0.0.0.0", env={"RUNWATCH_TRAJECTORY_TOKEN": TOKEN})
    s.start()
    try:
        assert httpx.get(s.url + "/reset_data").status_code == 401
        r = httpx.get(s.url + "/reset_data", headers=BEARER)
        assert (r.status_code, r.text) == (200, "Reset successful")
    finally:
        s.stop()


ALLOWED = "http://localhost:5173"


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A loopback server without a token (as today), one origin allowed, one group queued."""
    s = Server(tmp_path_factory.mktemp("loopback"), "--cors-origin", ALLOWED).start()
    try:
        assert httpx.post(s.url + "/register", json=REGISTRATION).status_code == 200
        httpx.get(s.url + "/batch")
        assert httpx.post(s.url + "/scored_data", json=group(1.0)).status_code == 200
        yield s
    finally:
        s.stop()


def test_cross_origin_requests_are_refused_and_allowed_origins_served(loopback: Server) -> None:
    """What a page of another site makes a browser send (its Origin, or Sec-Fetch-Site
    without one) is refused with 403 before it does anything; a listed origin is served
    with its CORS headers (no credentials); a rebound DNS name is refused."""
    before = loopback.logged()
    evil = {"Origin": "https://evil.example"}
    with httpx.Client(base_url=loopback.url) as c:
        for headers in (evil, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
            r = c.get("/reset_data", headers=headers)
            assert r.status_code == 403, r.text
            assert "access-control-allow-origin" not in r.headers
            assert "--cors-origin" in r.json()["detail"]
        text = {**evil, "Content-Type": "text/plain"}  # a "simple" request: no preflight
        r = c.post("/scored_data", content=json.dumps(group(6.0)), headers=text)
        assert r.status_code == 403
        assert c.get("/batch", headers=evil).status_code == 403
        preflight = {**evil, "Access-Control-Request-Method": "POST"}
        r = c.options("/scored_data", headers=preflight)
        assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
        # DNS rebinding: evil.example re-pointed at 127.0.0.1 is same-origin to the page
        name = f"evil.example:{loopback.port}"
        rebound = {"Host": name, "Origin": f"http://{name}"}
        assert c.get("/reset_data", headers=rebound).status_code == 403
        assert loopback.logged() == before  # nothing reset, nothing pushed, nothing served

        r = c.get("/status", headers={"Origin": ALLOWED})
        assert r.status_code == 200 and r.json()["queue_size"] == 1
        assert r.headers["access-control-allow-origin"] == ALLOWED
        assert "access-control-allow-credentials" not in r.headers
        r = c.options(
            "/scored_data",
            headers={
                "Origin": ALLOWED,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ALLOWED
        # clients that send neither header (requests, httpx, aiohttp) are served as today
        assert c.get("/status").json()["queue_size"] == 1
        assert c.get("/status", headers={"Host": "localhost"}).status_code == 200
