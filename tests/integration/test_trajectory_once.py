"""Exactly once for retried pushes, endpoint by endpoint, on the embedded log (in-process
app, real log files): ``Idempotency-Key`` replays, key reuse, a retry that overtakes its
first attempt, a restart, the window, and content dedupe."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from events.catalog.trajectory import (
    TRAJECTORIES_TOPIC,
    ScoredDataGroupStored,
    TrajectoryGroupDeduplicated,
)
from events.codec import decode
from tests.integration.test_trajectory_api import (
    client_for,
    group,
    settle,
    start_training,
    wait_ready,
)


def stored_on_log(c: TestClient) -> list[ScoredDataGroupStored]:
    host = c.app.state.host  # type: ignore[attr-defined]
    evs = [decode(r.value) for r in host.backend.read_sync(TRAJECTORIES_TOPIC)]
    return [e for e in evs if isinstance(e, ScoredDataGroupStored)]


def served_scores(c: TestClient) -> list[float]:
    out: list[float] = []
    while batch := c.get("/batch").json()["batch"]:
        out += [g["scores"][0] for g in batch]
    return out


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def test_a_retry_returns_the_first_answer_and_appends_nothing(tmp_path: Path) -> None:
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        body = [group(float(i)) for i in range(4)]
        first = c.post("/scored_data_list", json=body, headers=keyed("push-1"))
        settle(c)
        again = c.post("/scored_data_list", json=body, headers=keyed("push-1"))
        assert first.json() == again.json() == {"status": "received", "groups_processed": 4}
        assert "idempotent-replayed" not in first.headers
        assert again.headers["idempotent-replayed"] == "true"
        one = c.post("/scored_data", json=group(9.0), headers=keyed("push-2"))
        settle(c)
        assert c.post("/scored_data", json=group(9.0), headers=keyed("push-2")).json() == (
            one.json()
        )
        assert len(stored_on_log(c)) == 5  # the retries appended nothing
        assert c.get("/status").json()["queue_size"] == 5
        assert served_scores(c) == [0.0, 1.0, 2.0, 3.0]  # (9.0 waits for a full batch)


def test_a_key_reused_for_another_body_is_refused(tmp_path: Path) -> None:
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        c.post("/scored_data_list", json=[group(1.0), group(2.0)], headers=keyed("k"))
        settle(c)
        other = c.post("/scored_data_list", json=[group(1.0), group(3.0)], headers=keyed("k"))
        assert other.status_code == 422 and "another body" in other.json()["detail"]
        fewer = c.post("/scored_data_list", json=[group(1.0)], headers=keyed("k"))
        assert fewer.status_code == 422
        assert c.post("/scored_data", json=group(1.0), headers=keyed("")).status_code == 422
        assert c.post("/scored_data", json=group(1.0), headers=keyed("x" * 256)).status_code == 422
        assert len(stored_on_log(c)) == 2


def test_a_retry_that_overtakes_its_first_attempt_waits_for_it(tmp_path: Path) -> None:
    """The second request arrives while the first is still being made durable (its
    payload append held back): it waits, then answers the first's answer; one set of
    groups on the log."""
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        host = c.app.state.host  # type: ignore[attr-defined]
        real = host.backend.append_many
        gate = threading.Event()
        entered = threading.Event()

        async def slow(topic: str, records: Any, **kw: Any) -> Any:
            if topic == "runwatch.trajectory-payloads":
                entered.set()
                while not gate.is_set():
                    await __import__("asyncio").sleep(0.01)
            return await real(topic, records, **kw)

        host.backend.append_many = slow
        body = [group(1.0), group(2.0)]
        answers: list[Any] = []

        def post() -> None:
            answers.append(c.post("/scored_data_list", json=body, headers=keyed("race")))

        threads = [threading.Thread(target=post) for _ in range(3)]
        threads[0].start()
        assert entered.wait(10)
        for t in threads[1:]:
            t.start()
        inflight = c.app.state.inflight  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while inflight.waiting < 2:  # both retries wait on the first attempt
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gate.set()
        for t in threads:
            t.join(20)
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert len({str(a.json()) for a in answers}) == 1
        assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 2
        settle(c)
        assert len(stored_on_log(c)) == 2


def test_a_retry_after_a_restart_is_answered_from_the_log(tmp_path: Path) -> None:
    body = [group(float(i)) for i in range(3)]
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        c.post("/scored_data_list", json=body, headers=keyed("before-crash"))
        settle(c)
    with client_for(tmp_path / "log") as c:  # a new instance: the key is on the log
        r = c.post("/scored_data_list", json=body, headers=keyed("before-crash"))
        assert r.headers["idempotent-replayed"] == "true"
        assert r.json() == {"status": "received", "groups_processed": 3}
        assert len(stored_on_log(c)) == 3


def test_the_fold_drops_a_repeat_it_meets_on_the_log(tmp_path: Path) -> None:
    """Two instances can both append a push (the key in flight on one, not yet folded by
    the other): the fold keeps the first of each (key, index) and serves nothing twice."""
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        host = c.app.state.host  # type: ignore[attr-defined]
        real = host.pushed
        host.pushed = lambda key: None  # as if the first push were not folded here yet
        body = [group(1.0), group(2.0)]
        c.post("/scored_data_list", json=body, headers=keyed("twice"))
        c.post("/scored_data_list", json=body, headers=keyed("twice"))
        host.pushed = real
        settle(c)
        assert len(stored_on_log(c)) == 4 and len(host.view.queue) == 2
        assert served_scores(c) == [1.0, 2.0]
        dropped = [
            d
            for d in map(decode, (r.value for r in host.backend.read_sync("runwatch.batches")))
            if isinstance(d, TrajectoryGroupDeduplicated)
        ]
        assert [(d.by, d.key_index) for d in dropped] == [
            ("idempotency_key", 0),
            ("idempotency_key", 1),
        ]


def test_a_retry_beyond_the_window_is_stored_again(tmp_path: Path) -> None:
    with client_for(tmp_path / "log", idempotency_window=2) as c:
        wait_ready(c)
        start_training(c)
        c.post("/scored_data", json=group(1.0), headers=keyed("old"))
        c.post("/scored_data_list", json=[group(2.0), group(3.0)])
        settle(c)
        r = c.post("/scored_data", json=group(1.0), headers=keyed("old"))
        settle(c)
        assert "idempotent-replayed" not in r.headers
        assert c.get("/status").json()["queue_size"] == 4


@pytest.mark.parametrize("dedupe", [False, True])
def test_content_dedupe_is_off_by_default(tmp_path: Path, dedupe: bool) -> None:
    with client_for(tmp_path / "log", dedupe_content=dedupe) as c:
        wait_ready(c)
        start_training(c)
        assert c.post("/scored_data", json=group(1.0)).json() == {"status": "received"}
        again = c.post("/scored_data", json=group(1.0)).json()
        listed = c.post("/scored_data_list", json=[group(1.0), group(2.0), group(2.0)]).json()
        settle(c)
        if dedupe:
            assert again == {"status": "duplicate"}
            assert listed == {"status": "received", "groups_processed": 3, "duplicates": 2}
            assert c.get("/status").json()["queue_size"] == 2
            assert len(stored_on_log(c)) == 2
            assert all(e.content_digest and e.dedupe_window for e in stored_on_log(c))
        else:
            assert again == {"status": "received"}
            assert listed == {"status": "received", "groups_processed": 3}
            assert c.get("/status").json()["queue_size"] == 5
