"""Red-team round (2026-11) on the trajectory API, each hole reproduced for real and
asserted closed: bodies that were 500s, or were stored and then broke every trainer that
read ``/batch`` (against ``runwatch serve trajectories`` processes); bodies that never
finish (408); and a tail task that died silently while pushes still got 200 and
``/health`` said ready (the real app over real HTTP, uvicorn in a thread, its log made to
fail as it did out of file descriptors). The body budget's half of the loris is in
``test_trajectory_security.py``.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from events.catalog.trajectory import TRAJECTORIES_TOPIC
from events.log.base import Record
from events.log.embedded import EmbeddedLog
from producers.trajectory_api import RequestBodyMiddleware
from runwatch.apps.trajectories import TrajectoryHost, TrajectorySettings
from runwatch.apps.trajectory_app import build_app
from tests.integration.test_trajectory_security import (
    REGISTRATION,
    RawPush,
    Server,
    free_port,
    group,
    registered_server,
)

HUGE = "1" + "0" * 5000  # beyond what Python's json.loads reads (4,300 digits)


def deep(field: str, depth: int) -> str:
    opening, closing = ("[", "]") if field == "images" else ('{"a":', "}")
    return opening * depth + "1" + closing * depth


ONE_ROW = '"masks": [[1]], "scores": [1.0]'
#: The red team's bodies: each was a 500, or was stored and a ``/batch`` holding it
#: failed in ``json.loads``.
BODIES = {
    "negative and huge id": f'{{"tokens": [[-5, {HUGE}]], "masks": [[1, 1]], "scores": [1.0]}}',
    "huge id": f'{{"tokens": [[{HUGE}]], {ONE_ROW}}}',
    "id of 2**70": f'{{"tokens": [[{2**70}]], {ONE_ROW}}}',
    "id of 2**63": f'{{"tokens": [[{2**63}]], {ONE_ROW}}}',
    "huge mask value": f'{{"tokens": [[1, 2]], "masks": [[-100, {HUGE}]], "scores": [1.0]}}',
    **{
        f"{field} {depth} deep": f'{{"tokens": [[1]], {ONE_ROW}, "{field}": {deep(field, depth)}}}'
        for field in ("images", "generation_params", "group_overrides")
        for depth in (100, 900, 1000, 10_000)
    },
}


@pytest.fixture(scope="module", params=["no vocabulary", "--vocab-size"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server (without and with ``--vocab-size``), its trainer registered and started."""
    args = ("--vocab-size", "1000") if request.param == "--vocab-size" else ()
    with registered_server(tmp_path_factory.mktemp("redteam"), *args) as s:
        yield s


def test_bodies_that_were_500s_or_poisoned_batch_are_422(trained: Server) -> None:
    """Every red-team body gets 422 with FastAPI's detail, alone and in a list, nothing is
    stored, and the server goes on: the next groups are served in a ``/batch`` that
    Python's ``json.loads`` reads (it could not, with a 5,000-digit id or 900-deep
    ``images`` in it)."""
    with httpx.Client(base_url=trained.url, timeout=30) as c:
        for name, body in BODIES.items():
            for path, sent in (("/scored_data", body), ("/scored_data_list", f"[{body}]")):
                r = c.post(path, content=sent, headers={"Content-Type": "application/json"})
                assert r.status_code == 422, f"{name} {path}: {r.status_code} {r.text[:200]}"
                assert r.json()["detail"][0]["type"], name
        assert not trained.logged("runwatch.trajectory-payloads")
        for marker in (1.0, 2.0):
            assert c.post("/scored_data", json=group(marker)).json() == {"status": "received"}
        batch = None
        deadline = time.monotonic() + 10
        while not batch:  # (a trainer polls until its first batch is formed)
            assert time.monotonic() < deadline, "no batch was served"
            batch = json.loads(c.get("/batch").content)["batch"]  # as a trainer reads it
        assert [g["scores"][0] for g in batch] == [1.0, 2.0]
    assert "Traceback" not in trained.output()


def test_the_body_timeout_is_a_serve_option(tmp_path: Path) -> None:
    """``runwatch serve trajectories --body-timeout-s 1``: a request that declares a body
    and sends none is answered 408 after about a second (the default is 30 s)."""
    s = Server(tmp_path, "--body-timeout-s", "1").start()
    try:
        loris = RawPush(s.port, b" " * 10_000, sent=0)
        began = time.monotonic()
        answer = loris.answer(timeout_s=10)
        assert answer is not None and answer[0] == 408, answer
        assert 0.8 < time.monotonic() - began < 5
        loris.close()
    finally:
        s.stop()


# -- the real app over real HTTP, in this process ------------------------------------------


class Served:
    """The trajectory app served by uvicorn on a thread; ``call`` runs a function on the
    server's event loop."""

    def __init__(self, host: TrajectoryHost, app: Any) -> None:
        self.host, self.port = host, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        wait_for(lambda: self.server.started and self.host.ready, "the server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)

    def call(self, fn: Callable[[], object]) -> None:
        self.host._tasks[0].get_loop().call_soon_threadsafe(fn)


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def app_over(backend: EmbeddedLog, **body: float) -> tuple[TrajectoryHost, Any]:
    """The app ``runwatch serve trajectories`` runs, over ``backend``; ``body``: the
    request body middleware's time limits (``timeout_s``, ``min_rate``)."""
    host = TrajectoryHost(backend, TrajectorySettings(instance="redteam"))
    app = build_app(host)
    (middleware,) = [m for m in app.user_middleware if m.cls is RequestBodyMiddleware]
    middleware.kwargs.update(body)
    return host, app


def test_a_body_that_stalls_or_trickles_gets_408_and_holds_nothing(tmp_path: Path) -> None:
    """With a 0.5 s body timeout and 1,000 bytes/s: a request that declares a body and
    sends none (the loris), and one that sends 10 bytes every 0.1 s (never pausing 0.5 s,
    but too slow), get 408 with the reason and their connections closed; nothing stays
    taken from the budget. A client that pauses less and keeps up is served."""
    host, app = app_over(EmbeddedLog(tmp_path / "log", sync=False), timeout_s=0.5, min_rate=1000)
    with Served(host, app) as served:
        loris = RawPush(served.port, b" " * 10_000, sent=0)
        began = time.monotonic()
        answer = loris.answer(timeout_s=5)
        took = time.monotonic() - began
        assert answer is not None, "a stalled body was never answered"
        status, headers, detail = answer
        assert (status, headers["connection"]) == (408, "close")
        assert json.loads(detail)["detail"].startswith("request body too slow: 0 bytes in")
        assert 0.4 < took < 3, took
        assert loris.sock.recv(1) == b""  # the server closed it
        loris.close()

        trickle = RawPush(served.port, b" " * 10_000, sent=0)
        stop = threading.Event()

        def drip() -> None:
            while not stop.wait(0.1):
                try:
                    trickle.sock.sendall(b" " * 10)
                except OSError:
                    return

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        began = time.monotonic()
        answer = trickle.answer(timeout_s=5)
        stop.set()
        dripper.join(5)
        assert answer is not None and answer[0] == 408, answer
        assert 0.4 < time.monotonic() - began < 3
        sent = int(json.loads(answer[2])["detail"].split()[4])
        assert sent > 0  # it never paused: the rate rule answered it
        trickle.close()
        assert host.body_budget.held == 0

        with httpx.Client(base_url=served.url) as c:
            assert c.post("/scored_data", json=group(1.0)).status_code == 200
            body = json.dumps(group(2.0)).encode()

            def halting() -> Iterator[bytes]:
                yield body[:10]
                time.sleep(0.2)
                yield body[10:]

            assert c.post("/scored_data", content=halting()).json() == {"status": "received"}
        assert host.body_budget.held == 0


class FlakyLog(EmbeddedLog):
    """The embedded log, whose reads of the run's partition fail while ``failing`` is set,
    as they did out of file descriptors (the red team held 1,100 idle connections to a
    server limited to 1,024 fds)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, sync=False)
        self.failing = threading.Event()

    def read_sync(
        self, topic: str, from_offset: int = 0, max_records: int | None = None
    ) -> Iterator[Record]:
        if topic == TRAJECTORIES_TOPIC and self.failing.is_set():
            raise OSError(errno.EMFILE, "Too many open files")
        return super().read_sync(topic, from_offset, max_records)


def health(c: httpx.Client) -> tuple[int, dict[str, Any]]:
    r = c.get("/health")
    return r.status_code, r.json()


def test_a_failing_tail_is_retried_logged_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The red team's tail death: the tail's reads fail (EMFILE) after the trainer
    started. A push still gets 200 (its group is on the log), each failure is logged,
    ``/health`` turns 503 naming the stall and the error once the pushed record has
    waited ``tail_stall_s``; when reads work again the tail goes on where it stopped,
    says so, ``/health`` is 200 again and the group is served."""
    caplog.set_level(logging.WARNING, logger="runwatch.apps.trajectories")
    backend = FlakyLog(tmp_path / "log")
    host, app = app_over(backend)
    host.tail_stall_s = 0.3
    with Served(host, app) as served, httpx.Client(base_url=served.url, timeout=30) as c:
        assert c.post("/register", json=REGISTRATION).status_code == 200
        wait_for(lambda: host.view.registration is not None, "registration not folded")
        assert c.get("/batch").json() == {"batch": None}  # (the trainer started)
        assert health(c)[0] == 200 and health(c)[1]["problem"] is None

        backend.failing.set()
        wait_for(lambda: host.tail_failures >= 2, "the tail never failed")
        assert c.post("/scored_data", json=group(1.0)).json() == {"status": "received"}
        wait_for(lambda: health(c)[0] == 503, "/health never said the tail stalled")
        problem = health(c)[1]["problem"]
        assert "trajectory tail stalled" in problem and "Too many open files" in problem

        backend.failing.clear()
        wait_for(lambda: health(c)[0] == 200, "/health never recovered")
        assert health(c)[1]["problem"] is None and host.tail_failures == 0
        assert c.post("/scored_data", json=group(2.0)).json() == {"status": "received"}
        batch = c.get("/batch").json()["batch"]
        assert [g["scores"][0] for g in batch] == [1.0, 2.0]
    failed = [r for r in caplog.records if r.getMessage().startswith("trajectory tail failed")]
    assert len(failed) >= 2 and all(r.levelno == logging.ERROR for r in failed)
    assert "Too many open files" in failed[0].getMessage() and failed[0].exc_info
    assert sum("trajectory tail reading again" in r.getMessage() for r in caplog.records) == 1


def test_a_dead_background_task_is_logged_and_makes_health_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A background task that ends before the host stops (here the tail, cancelled) is
    logged and ``/health`` answers 503 with the reason from then on."""
    caplog.set_level(logging.ERROR, logger="runwatch.apps.trajectories")
    host, app = app_over(EmbeddedLog(tmp_path / "log", sync=False))
    with Served(host, app) as served, httpx.Client(base_url=served.url) as c:
        assert health(c)[0] == 200
        tail = host._tasks[0]
        served.call(tail.cancel)
        wait_for(tail.done, "the tail was not cancelled")
        status, body = health(c)
        assert status == 503 and body["problem"] == "trajectory-tail ended: cancelled", body
    assert any("trajectory-tail ended: cancelled" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if "publish" in r.getMessage()]  # stop is quiet


def test_a_quiet_healthy_tail_is_not_called_stalled(tmp_path: Path) -> None:
    """Nothing waiting, nothing stalled: an idle instance stays 200 past ``tail_stall_s``,
    and one that folds what it appends too."""
    host, app = app_over(EmbeddedLog(tmp_path / "log", sync=False))
    host.tail_stall_s = 0.2
    with Served(host, app) as served, httpx.Client(base_url=served.url) as c:
        assert c.post("/register", json=REGISTRATION).status_code == 200
        for marker in range(5):
            assert c.post("/scored_data", json=group(float(marker))).status_code == 200
            time.sleep(0.1)
            assert health(c)[0] == 200
        time.sleep(0.3)
        assert health(c)[0] == 200 and health(c)[1]["problem"] is None
