"""A resume judged on a lagging view does not lift a later gate's pause (found by review).

Real pieces on one embedded log: a hooked run (``RunwatchHook`` obeying at step
boundaries on a training thread), the CLI's path (``producers.commands.issue``) and the
query API over a read model rebuilt from a prefix of the log (what a lagging follower
serves). Gate A pauses, an operator resumes through the CLI, gate B pauses; the customer,
still shown "paused by gate A", resumes: before, the run resumed (gate B's pause lifted, a
pause the customer never saw); now the resume names pause A and the run refuses it
(``CommandRejected``), held by B until a resume of B."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from events.catalog.control import CONTROL_TOPIC, CommandRejected, PauseRequested
from events.catalog.lifecycle import RunPaused, RunResumed
from events.envelope import EventBase, new_envelope
from events.log.embedded import EmbeddedLog
from producers.commands import issue
from producers.hooks.hook import RunwatchHook
from producers.sinks import EmbeddedSink
from projections.api import create_app
from projections.keys import ApiKeys
from projections.sqlite_store import SqliteReadModel
from runwatch.hosting.replay import rebuild_from_log

pytestmark = pytest.mark.timeout(120)

TENANT, RUN = "tenant-a", "tenant-a:exp-1"


def _facts(log: Path) -> list[EventBase]:
    r = EmbeddedLog(log, readonly=True)
    r.open_sync()
    topics = [t for t in ("runwatch.lifecycle", CONTROL_TOPIC) if t in r.topic_names()]
    return [e for e in r.iter_events(topics) if isinstance(e, EventBase) and e.run_id == RUN]


def _positions(log: Path) -> dict[str, int]:
    r = EmbeddedLog(log, readonly=True)
    r.open_sync()
    return {f"{t}:0": sum(1 for _ in r.read_sync(t, 0)) for t in r.topic_names()}


def _count(log: Path, cls: type, n: int, timeout: float = 30.0) -> list[EventBase]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = [e for e in _facts(log) if isinstance(e, cls)]
        if len(got) >= n:
            return got
        time.sleep(0.05)
    raise AssertionError(f"no {n} {cls.__name__} in {timeout} s")


def _gate_pause(log: Path, alert: str) -> str:
    ev = PauseRequested(
        **new_envelope(tenant_id=TENANT, run_id=RUN, producer="control/run-controller", seq=0),
        actor="controller", reason=f"gate {alert} paged", alert_id=alert,
    )  # fmt: skip
    sink = EmbeddedSink(EmbeddedLog(log))
    sink.write([ev])
    sink.close()
    return str(ev.event_id)


def test_a_stale_resume_does_not_lift_a_later_gates_pause(tmp_path: Path) -> None:
    log = tmp_path / "log"
    hook = RunwatchHook(RUN, TENANT, log=log, command_poll_s=0.05, install_exit_hooks=False)
    hook.start({"model": "tiny"})
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            hook.log({"loss": 1.0 / step}, step)
            hook.step_done(step, wall_s=0.02)
            if hook.obey(step):
                return
            time.sleep(0.02)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        _gate_pause(log, "alert-A")
        _count(log, RunPaused, 1)
        stale_until = _positions(log)  # the API's follower lags here
        cli = issue(log, RUN, "resume", actor="operator", principal="alice")
        assert not cli.refused
        _count(log, RunResumed, 1)
        pause_b = _gate_pause(log, "alert-B")
        _count(log, RunPaused, 2)

        store = SqliteReadModel(tmp_path / "stale.sqlite")
        rebuild_from_log(log, store, until=stale_until)
        keys = ApiKeys.from_mapping({"keys": [{"key": "k-a", "tenant": TENANT}]})
        api = TestClient(create_app(store, keys, commands=EmbeddedSink(EmbeddedLog(log))))
        h = {"Authorization": "Bearer k-a"}
        doc = api.get(f"/v1/runs/{RUN}", headers=h).json()
        assert doc["state"] == "PAUSED_BY_GATE" and "alert-A" in doc["reason"]  # stale
        r = api.post(f"/v1/runs/{RUN}/resume", headers=h, json={"reason": "A is fixed"})
        assert r.status_code == 202, r.text
        stale_id = r.json()["command_id"]

        rejected = _count(log, CommandRejected, 1)
        assert rejected[0].command_id == stale_id
        assert pause_b in rejected[0].reason and "look again" in rejected[0].reason
        time.sleep(0.5)
        assert len([e for e in _facts(log) if isinstance(e, RunResumed)]) == 1  # B holds

        # a resume from a view that saw B resumes the run
        store_now = SqliteReadModel(tmp_path / "now.sqlite")
        rebuild_from_log(log, store_now)
        api_now = TestClient(create_app(store_now, keys, commands=EmbeddedSink(EmbeddedLog(log))))
        r = api_now.post(f"/v1/runs/{RUN}/resume", headers=h, json={"reason": "B seen"})
        assert r.status_code == 202, r.text
        resumed = _count(log, RunResumed, 2)
        assert resumed[-1].request_id == r.json()["command_id"]
    finally:
        stop.set()
        thread.join(timeout=10)
        hook.close(timeout_s=5)
