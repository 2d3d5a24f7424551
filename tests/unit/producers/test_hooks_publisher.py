"""The hook's publisher on real directories: an unreachable log is spooled, said once,
and shipped when it is back; nothing lost, nothing raised into the caller.

"Unreachable" is real: the target log's parent path is a regular file, so creating the
log fails with an OSError until the test removes that file.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from events.catalog.lifecycle import RunStarted
from events.envelope import EventBase, new_envelope
from events.log.embedded import EmbeddedLog
from producers.hooks import RunwatchHook
from producers.hooks.publisher import Publisher, Target


def _events(path: Path) -> list[EventBase]:
    log = EmbeddedLog(path, readonly=True)
    log.open_sync()
    return [e for e in log.iter_events() if isinstance(e, EventBase)]


def _blocked(tmp_path: Path) -> tuple[Path, Path]:
    blocker = tmp_path / "mnt"
    blocker.write_text("not a directory")
    return blocker, blocker / "log"


def _wait(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_unreachable_log_is_spooled_said_once_then_shipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwatch.hooks")
    blocker, target = _blocked(tmp_path)
    hook = RunwatchHook(
        "r", "t", log=target, spool=tmp_path / "spool", retry_s=0.1, install_exit_hooks=False
    )
    hook.start()
    for step in range(1, 51):
        hook.step_done(step, wall_s=0.1)
        hook.log({"reward": 0.1 * step, "kl": 0.01}, step=step)
    assert hook.flush(20)
    stats = hook.stats()
    assert stats["mode"] == "spooling" and stats["written"] == 0 and stats["spooled"] > 0
    warnings = [r for r in caplog.records if " unreachable (" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path / "spool") in warnings[0].getMessage()

    blocker.unlink()  # the log is back
    _wait(lambda: hook.stats()["mode"] == "direct")
    hook.log({"reward": 1.0}, step=51)
    hook.finish()
    final = hook.close(10)
    assert final.left_in_spool == 0 and final.dropped == 0 and final.failed_jobs == 0
    events = _events(target)
    assert sorted(e.seq for e in events) == list(range(final.built))
    assert [e.seq for e in events if e.type == "TrainerStepCompleted"] == sorted(
        e.seq for e in events if e.type == "TrainerStepCompleted"
    )  # the spool went first: one producer's order kept on the topic
    assert len([r for r in caplog.records if " unreachable (" in r.getMessage()]) == 1


def test_a_spool_left_by_a_dead_process_is_shipped_by_the_next(tmp_path: Path) -> None:
    blocker, target = _blocked(tmp_path)
    first = RunwatchHook("r", "t", log=target, spool=tmp_path / "spool", install_exit_hooks=False)
    first.log({"reward": 0.5}, step=1)
    stats = first.close(timeout_s=0.5)  # the log never came back while it ran
    assert stats.left_in_spool == stats.built > 0
    blocker.unlink()
    second = RunwatchHook("r", "t", log=target, spool=tmp_path / "spool", install_exit_hooks=False)
    second.log({"reward": 0.6}, step=2)
    later = second.close(10)
    # the leftovers first, then its own events: behind them through the spool, or written
    # directly once the spool was drained (which of the two depends on the worker's pace)
    assert later.shipped_from_spool >= stats.built and later.left_in_spool == 0
    assert later.shipped_from_spool + later.written == stats.built + later.built
    assert later.outages == 0  # the log was not found unreachable: nothing warned so
    steps = [e.step for e in _events(target) if e.type == "TrainerStepCompleted"]
    assert steps == [1, 2]  # order kept


def test_a_bad_fact_is_counted_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwatch.hooks")
    pub = Publisher(Target.embedded(tmp_path / "log"), tmp_path / "spool")

    def bad() -> list[EventBase]:
        raise ValueError("a metric that is not a number")

    def good() -> list[EventBase]:
        env = new_envelope(tenant_id="t", run_id="r", producer="p", seq=0)
        return [RunStarted(**env)]

    for _ in range(3):
        pub.submit(bad)
    pub.submit(good)
    stats = pub.close(10)
    assert stats.failed_jobs == 3 and stats.written == 1
    assert len([r for r in caplog.records if "could not be turned" in r.getMessage()]) == 1


def test_a_full_queue_drops_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwatch.hooks")
    busy, gate = threading.Event(), threading.Event()

    def slow() -> list[EventBase]:
        busy.set()
        gate.wait(10)
        return []

    pub = Publisher(Target.embedded(tmp_path / "log"), tmp_path / "spool", queue_size=5)
    pub.submit(slow)
    assert busy.wait(10)  # the worker is stuck in a fact: nothing leaves the queue now
    accepted = [pub.submit(slow) for _ in range(20)]
    gate.set()
    stats = pub.close(10)
    assert accepted.count(True) == 5 and accepted.count(False) == stats.dropped == 15
    assert len([r for r in caplog.records if "dropping" in r.getMessage()]) == 1


def test_hook_calls_return_in_microseconds(tmp_path: Path) -> None:
    hook = RunwatchHook(
        "r", "t", log=tmp_path / "log", spool=tmp_path / "spool", install_exit_hooks=False
    )
    hook.start()
    row = {f"k{i}": float(i) for i in range(25)} | {"reward": 0.5, "kl": 0.1}
    times = []
    for step in range(1, 501):
        t = time.perf_counter()
        hook.step_done(step)
        hook.log(row, step=step)
        times.append(time.perf_counter() - t)
    hook.close(20)
    times.sort()
    assert times[len(times) // 2] < 1e-3, times[len(times) // 2]  # honest margin: ~10 us
