"""Fuzzing the HTTP surfaces (issue #19 item 4): every endpoint of the query API
(``runwatch serve api``, its dashboard routes included), the trajectory API (``runwatch
serve trajectories``) and the reference webhook receiver answers hostile requests with a
2xx or a 4xx — never a 5xx, never a hang — and is still serving afterwards.

Two variants: in-process (FastAPI's TestClient on the real apps over a real SQLite read
model and real embedded logs: fast, hundreds of requests), and against the real server
processes over real HTTP with a per-request timeout, plus raw malformed HTTP on a socket.
Requests come from :func:`tests.fuzzing.http_request`: each route's own method mostly,
hostile path parameters and query values, valid/garbage/no credentials, JSON bodies
built from the route's schema and then broken (wrong types, missing and extra fields,
huge numbers, NaN, lone surrogates, nesting 100,000 deep), random bytes, gzip (and
bodies that only claim to be gzip).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from events.log.embedded import EmbeddedLog
from producers.sinks import EmbeddedSink
from projections.api import create_app
from projections.keys import ApiKeys
from projections.sqlite_store import SqliteReadModel
from runwatch.apps.query_api import build_app as build_query_app
from runwatch.apps.trajectories import TrajectoryHost, TrajectorySettings
from runwatch.apps.trajectory_app import build_app
from runwatch.hosting.replay import rebuild_from_log
from tests.fuzzing import Endpoint, FuzzRequest, fastapi_endpoints, http_request
from tests.projection_runs import synth_fleet, write_log

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "keys": [
        {"key": "k-fuzz-tenant-0", "tenant": "tenant-0"},
        {"key": "k-fuzz-tenant-1", "tenant": "tenant-1"},
        {"key": "k-fuzz-ops", "operator": True},
    ]
}
AUTHS: tuple[tuple[tuple[bytes, bytes], ...], ...] = (
    (),
    ((b"Authorization", b"Bearer k-fuzz-tenant-0"),),
    ((b"Authorization", b"Bearer k-fuzz-tenant-1"),),
    ((b"Authorization", b"Bearer k-fuzz-ops"),),
    ((b"X-API-Key", b"k-fuzz-ops"),),
    ((b"Authorization", b"bearer    k-fuzz-tenant-0"),),
    ((b"Authorization", b"Basic azpr"),),
)
COMMAND = {"reason": "fuzz", "overrides": {"lr": 0.001}}
QUERY_BODIES = {
    "/v1/runs/{run_id}/resume": COMMAND,
    "/v1/runs/{run_id}/cancel": COMMAND,
    "/v1/operator/runs/{run_id}/{action}": COMMAND,
}

REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 4,
    "max_token_len": 64,
    "checkpoint_dir": "/tmp/ckpt",
    "save_checkpoint_interval": 10,
    "starting_step": 0,
    "num_steps": 100,
}
ENV = {"max_token_length": 64, "desired_name": "math", "weight": 1.0, "group_size": 2}
GROUP = {
    "tokens": [[1, 2, 3], [4, 5, 6]],
    "masks": [[-100, 2, 3], [-100, 5, 6]],
    "scores": [0.5, 1.0],
    "messages": [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]],
    "env_id": 0,
}
TRAJECTORY_ENDPOINTS = [
    Endpoint("POST", "/register", body=REGISTRATION),
    Endpoint("POST", "/register-env", body=ENV),
    Endpoint("POST", "/disconnect-env", body={"env_id": 0}),
    Endpoint("POST", "/scored_data", body=GROUP),
    Endpoint("POST", "/scored_data_list", body=[GROUP, GROUP]),
    Endpoint("GET", "/batch"),
    Endpoint("GET", "/status"),
    Endpoint("GET", "/status-env", query=("env_id",), body={"env_id": 0}),
    Endpoint("GET", "/info"),
    Endpoint("GET", "/wandb_info"),
    Endpoint("GET", "/latest_example"),
    Endpoint("GET", "/health"),
    Endpoint("GET", "/"),
    Endpoint("GET", "/reset_data"),
    Endpoint("GET", "/{path}"),  # what is not a route at all
]
RECEIVER_ENDPOINTS = [
    Endpoint("POST", "/hook", body={"type": "RunStateChanged", "run_id": "r"}),
    Endpoint("POST", "/{path}", body={}),
]


def weighted(endpoints: list[Endpoint]) -> list[Endpoint]:
    """Routes that take a body (more to break) three times as often as the others."""
    return [
        e for e in endpoints for _ in range(3 if e.body is not None or e.method == "POST" else 1)
    ]


def answered(req: FuzzRequest, response: httpx.Response) -> None:
    """The whole contract of one request: an answer, and not a server error."""
    assert response.status_code < 500, (
        f"{req.method} {req.url} params={req.params!r} headers={req.headers!r} "
        f"body={(req.body or b'')[:300]!r} -> {response.status_code} {response.text[:500]}"
    )


# -- in-process: the real apps under TestClient ----------------------------------------


@pytest.fixture(scope="module")
def query_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, list[str]]]:
    root = tmp_path_factory.mktemp("query")
    log = EmbeddedLog(root / "log", sync=False)
    log.open_sync()
    write_log(log, synth_fleet(6, 12, tenants=2))
    store = SqliteReadModel(root / "p.sqlite")
    rebuild_from_log(root / "log", store)
    views, _ = store.list_runs(None, 0, 100)
    sink = EmbeddedSink(EmbeddedLog(root / "control", sync=False))
    app = build_query_app(store, ApiKeys.from_mapping(KEYS), commands=sink)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, [v.run_id for v in views]


QUERY_ROUTES = fastapi_endpoints(create_app(SqliteReadModel(":memory:"), ApiKeys({})))


def test_query_api_routes_are_all_fuzzed() -> None:
    paths = {e.path for e in QUERY_ROUTES}
    assert {"/v1/runs", "/v1/runs/{run_id}/charts", "/v1/operator/runs/{run_id}/{action}"} <= paths
    assert any(p.startswith("/dashboard") for p in paths)


@settings(max_examples=200)
@given(data=st.data())
def test_query_api_in_process(query_app: tuple[TestClient, list[str]], data: st.DataObject) -> None:
    client, ids = query_app
    endpoint = data.draw(st.sampled_from(weighted(QUERY_ROUTES)), label="endpoint")
    endpoint = Endpoint(
        endpoint.method, endpoint.path, endpoint.query, QUERY_BODIES.get(endpoint.path)
    )
    req = data.draw(http_request(endpoint, tuple(ids[:4]), AUTHS), label="request")
    answered(req, req.send(client))


@pytest.fixture(scope="module")
def trajectory_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("trajectories")
    config = TrajectorySettings(instance="fuzz", batch_timeout_s=5.0, max_queue_groups=10**9)
    host = TrajectoryHost(EmbeddedLog(root / "log", sync=False), config)
    app = build_app(host)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 20
        while not host.ready:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert client.post("/register", json=REGISTRATION).status_code == 200
        client.post("/register-env", json=ENV)
        yield client


@settings(max_examples=200)
@given(data=st.data())
def test_trajectory_api_in_process(trajectory_app: TestClient, data: st.DataObject) -> None:
    endpoint = data.draw(st.sampled_from(weighted(TRAJECTORY_ENDPOINTS)), label="endpoint")
    req = data.draw(http_request(endpoint, ("0", "1", "batch")), label="request")
    answered(req, req.send(trajectory_app))


# -- regressions: each crash the fuzzers found, kept as an explicit example ---------------


def test_regression_query_api_422_renders_any_input(
    query_app: tuple[TestClient, list[str]],
) -> None:
    """FastAPI's own 422 handler failed to render a body that is not UTF-8 (sent as
    text/plain) or a NaN input: a 500 instead of the 422."""
    client, ids = query_app
    auth = {"Authorization": "Bearer k-fuzz-tenant-0"}
    r = client.post(
        f"/v1/runs/{ids[0]}/resume", content=b"\x80", headers={**auth, "Content-Type": "text/plain"}
    )
    assert r.status_code == 422, r.text
    r = client.post(
        f"/v1/runs/{ids[0]}/cancel",
        content=b'{"reason": NaN, "overrides": {"lr": "\\ud800"}}',
        headers={**auth, "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text


def test_regression_trajectory_registrations_are_bounded_text_and_numbers(
    trajectory_app: TestClient,
) -> None:
    """A lone surrogate in a registration made an event that could not be written (500);
    a 400-digit batch_size crashed the batching processor (every later /batch a 503), a
    400-digit max_token_length made /status-env a 500."""
    huge = "9" * 400
    bodies = [
        ("/register", json.dumps(REGISTRATION).replace('"g"', '"\\ud800"')),
        ("/register", json.dumps(REGISTRATION).replace('"batch_size": 4', f'"batch_size": {huge}')),
        ("/register-env", json.dumps(ENV).replace('"math"', '"\\udfff"')),
        (
            "/register-env",
            json.dumps(ENV).replace('"max_token_length": 64', f'"max_token_length": {huge}'),
        ),
        ("/register-env", json.dumps({**ENV, "weight": 1e308})),
    ]
    for path, body in bodies:
        r = trajectory_app.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (path, body[:200], r.status_code, r.text[:300])
    assert trajectory_app.get("/status-env", params={"env_id": 0}).status_code in (200, 404)
    assert trajectory_app.get("/batch").status_code == 200


def test_regression_a_poison_record_on_the_log_does_not_end_the_tail(tmp_path: Path) -> None:
    """A registration the API refuses now (400-digit batch_size), already on the log: the
    fold raised on the next batch request and the tail task died with it (every later
    answer that needs the fold: a 503, for good). Now the record is skipped and counted
    (since 2026-11-28 at decode: an event's integers are bounded), the tail goes on, and
    a reset plus a sound registration brings batches back."""
    from events.catalog.trajectory import TrajectoryEnvRegistered, TrajectoryTrainerRegistered
    from events.codec import encode
    from events.envelope import new_envelope

    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    env = {"tenant_id": "default", "run_id": "atropos", "producer": "old-version", "seq": 1}
    trainer = TrajectoryTrainerRegistered(
        **new_envelope(**env), requester_uuid="1", **REGISTRATION
    )  # as an earlier release wrote it: no bound on its integers (this one refuses it)
    registered = json.loads(encode(trainer))
    registered["batch_size"] = 10**400
    env_registered = TrajectoryEnvRegistered(
        **new_envelope(**env), request_id="r", **{**ENV, "min_batch_allocation": 0.5}
    )
    poison = [json.dumps(registered).encode(), encode(env_registered)]
    log.append_many_sync("runwatch.trajectories", [(b"atropos", raw) for raw in poison])
    config = TrajectorySettings(instance="poison", batch_timeout_s=1.0)
    host = TrajectoryHost(EmbeddedLog(tmp_path / "log", sync=False), config)
    with TestClient(build_app(host), base_url="http://127.0.0.1") as client:
        deadline = time.monotonic() + 20
        while not host.ready:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        client.post("/scored_data", json=GROUP)
        # the record is refused at decode now (an event's integers are bounded), so the
        # fold never sees it: skipped and counted, the tail lives and answers
        answer = client.get("/batch")
        assert answer.status_code == 200, answer.text
        assert host.skipped >= 1 and not host._tasks[0].done()  # the tail lives
        assert client.get("/status").status_code == 200
        assert client.get("/reset_data").status_code == 200
        assert client.post("/register", json=REGISTRATION).status_code == 200
        assert client.get("/batch").json() == {"batch": None}  # the tail answers again


# -- real server processes over real HTTP ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server as a child process; ``probe`` answers while it serves."""

    def __init__(self, name: str, argv: list[str], port: int, probe: tuple[str, str, int]):
        self.name, self.argv, self.port, self.probe = name, argv, port, probe
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.err: Path | None = None
        self.client = httpx.Client(base_url=self.url)  # one: a new client costs ~0.1 s

    def start(self, tmp: Path) -> Server:
        self.err = tmp / f"{self.name}.err"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        return self

    def wait_serving(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 90
        while not self.serving():
            assert self.proc.poll() is None, self.stderr()
            assert time.monotonic() < deadline, f"{self.name} did not come up: {self.stderr()}"
            time.sleep(0.1)

    def serving(self) -> bool:
        method, path, status = self.probe
        try:
            return httpx.request(method, self.url + path, timeout=2).status_code == status
        except httpx.HTTPError:
            return False

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")[-3000:] if self.err else ""

    def stop(self) -> None:
        self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """``runwatch serve api`` over a log of 6 runs, ``runwatch serve trajectories`` with a
    registered trainer and env, and the reference webhook receiver."""
    tmp = tmp_path_factory.mktemp("servers")
    log = EmbeddedLog(tmp / "api-log", sync=False)
    log.open_sync()
    write_log(log, synth_fleet(6, 12, tenants=2))
    (tmp / "keys.yaml").write_text(yaml.safe_dump(KEYS))
    (tmp / "secret").write_bytes(b"s" * 32)
    cli = [sys.executable, "-m", "runwatch.cli.main", "serve"]
    ports = [_free_port() for _ in range(3)]
    all_ = {
        "api": Server(
            "api",
            [*cli, "api", "--log", str(tmp / "api-log"), "--keys", str(tmp / "keys.yaml"),
             "--store", str(tmp / "view.sqlite"), "--port", str(ports[0]), "--settle-s", "0.2"],
            ports[0],
            ("GET", "/healthz", 200),
        ),
        "trajectories": Server(
            "trajectories",
            [*cli, "trajectories", "--log", str(tmp / "traj-log"), "--port", str(ports[1]),
             "--instance", "fuzz", "--state-dir", "none"],
            ports[1],
            ("GET", "/health", 200),
        ),
        "receiver": Server(
            "receiver",
            [sys.executable, "-m", "runwatch.notifier_receiver", "--port", str(ports[2]),
             "--secret-file", str(tmp / "secret")],
            ports[2],
            ("POST", "/hook", 401),
        ),
    }  # fmt: skip
    try:
        for server in all_.values():  # all three start at once
            server.start(tmp)
        for server in all_.values():
            server.wait_serving()
        ops = {"Authorization": "Bearer k-fuzz-ops"}
        deadline = time.monotonic() + 60
        while httpx.get(all_["api"].url + "/v1/runs", headers=ops).json().get("total", 0) < 6:
            assert time.monotonic() < deadline, "the API never folded the log"
            time.sleep(0.2)
        traj = all_["trajectories"].url
        assert httpx.post(traj + "/register", json=REGISTRATION).status_code == 200
        httpx.get(traj + "/batch")  # the trainer has started: envs may register
        assert httpx.post(traj + "/register-env", json=ENV).status_code == 200
        yield all_
    finally:
        for server in all_.values():
            server.stop()


SERVER_ENDPOINTS = {
    "api": [Endpoint(e.method, e.path, e.query, QUERY_BODIES.get(e.path)) for e in QUERY_ROUTES],
    "trajectories": TRAJECTORY_ENDPOINTS,
    "receiver": RECEIVER_ENDPOINTS,
}
RUN_IDS = ("run-0000", "run-0001", "run-0004")


@settings(max_examples=200)
@given(data=st.data())
def test_real_servers_answer_every_request_with_2xx_or_4xx(
    servers: dict[str, Server], data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(SERVER_ENDPOINTS)), label="server")
    endpoint = data.draw(st.sampled_from(weighted(SERVER_ENDPOINTS[name])), label="endpoint")
    req = data.draw(http_request(endpoint, RUN_IDS, AUTHS), label="request")
    server = servers[name]
    try:
        response = req.send(server.client, timeout=10.0)
    except httpx.LocalProtocolError:
        reject()  # the client itself refuses to send it: nothing reached the server
    except httpx.TimeoutException:
        raise AssertionError(f"{name}: no answer within 10 s to {req!r}") from None
    except httpx.TransportError as exc:
        raise AssertionError(f"{name}: connection broken by {req!r}: {exc!r}") from None
    answered(req, response)
    assert server.proc is not None and server.proc.poll() is None, server.stderr()


#: Bytes no HTTP client would send; each is written, the write side shut, and the server
#: must answer (not with a 5xx) or close within the timeout.
RAW_REQUESTS = {
    "garbage": bytes(range(256)) * 4,
    "tls_client_hello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 160,
    "bad_request_line": b"GET\r\n\r\n",
    "http_0_9": b"GET /\r\n",
    "unknown_version": b"GET / HTTP/7.3\r\nHost: x\r\n\r\n",
    "nul_in_path": b"GET /\x00../ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "header_100k": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + b"a" * 100_000 + b"\r\n\r\n",
    "10k_headers": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-A: 1\r\n" * 10_000 + b"\r\n",
    "no_colon_header": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nnocolon\r\n\r\n",
    "negative_length": (
        b"POST /scored_data HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n"
    ),
    "length_not_a_number": (
        b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1e3\r\n\r\n{}"
    ),
    "two_lengths": (
        b"POST /register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
        b"Content-Length: 9\r\n\r\n{}"
    ),
    "huge_length_short_body": (
        b"POST /scored_data HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999\r\n\r\n{}"
    ),
    "bad_chunks": (
        b"POST /scored_data HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nabc\r\n0\r\n\r\n"
    ),
    "chunked_and_length": (
        b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: 3\r\n\r\n0\r\n\r\n"
    ),
    "pipelined_junk": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + b"\xff" * 64,
    "partial_headers": b"GET /health HTTP/1.1\r\nHost: 127.0",
}


@pytest.mark.parametrize("case", sorted(RAW_REQUESTS))
def test_real_servers_survive_malformed_http(servers: dict[str, Server], case: str) -> None:
    for server in servers.values():
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            with contextlib.suppress(OSError):  # a server may close before reading it all
                conn.sendall(RAW_REQUESTS[case])
                conn.shutdown(socket.SHUT_WR)
            got = b""
            try:
                while chunk := conn.recv(65536):
                    got += chunk
            except ConnectionResetError:
                pass
            except TimeoutError:
                raise AssertionError(
                    f"{server.name}: {case}: neither answered nor closed"
                ) from None
        for status in (
            int(line.split()[1]) for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.")
        ):
            assert status < 500, (server.name, case, got[:300])
        assert server.serving(), (server.name, case, server.stderr())
