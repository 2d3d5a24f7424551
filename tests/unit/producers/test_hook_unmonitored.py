"""A hooked run that runwatch cannot see or command for too long is held at its step boundary
(:mod:`producers.hooks.unmonitored`), and released by recovery only.

Found by review (F2): a hook whose log went away spooled and trained on, unmonitored and
out of reach of a gate's pause, for as long as the outage lasted.

The guard's timer is tested on an injected clock (its ``sleep`` advances it); a real hook
on an embedded log made unreachable for real (its parent path a regular file, as in
``test_hooks_publisher.py``) is held and released.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from producers.hooks import RunwatchHook
from producers.hooks.publisher import MAX_RETRY_S, Publisher, Target
from producers.hooks.unmonitored import (
    DEFAULT_PAUSE_WHEN_UNMONITORED_S,
    UnmonitoredGuard,
    check_limit,
)


class Clock:
    """A fake monotonic clock; ``sleep`` advances it and runs what is due by then."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.at: list[tuple[float, object]] = []  # (when, fn) to run once the clock is past

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        for when, fn in list(self.at):
            if self.now >= when:
                self.at.remove((when, fn))
                fn()  # type: ignore[operator]


def _parts(clock: Clock, limit: float = 60.0):  # type: ignore[no-untyped-def]
    pub = SimpleNamespace(undelivered_since=None, delivered_at=None)
    fol = SimpleNamespace(unread_since=None, read_ok_at=clock.now)
    guard = UnmonitoredGuard(limit, pub, fol, run_id="r", clock=clock, sleep=clock.sleep)
    return guard, pub, fol


def test_in_touch_or_under_the_limit_never_holds() -> None:
    clock = Clock()
    guard, pub, _fol = _parts(clock)
    acted: list[int] = []
    assert guard.hold(1, lambda: acted.append(1) or False) is False
    pub.undelivered_since = clock.now  # the log just went away
    clock.now += 59.9
    assert guard.due() is None
    assert guard.hold(2, lambda: acted.append(1) or False) is False
    assert acted == [] and guard.holds == 0  # no wait, no extra look at the commands


@pytest.mark.parametrize("side", ["deliveries", "reads"])
def test_either_side_out_of_touch_past_the_limit_holds_until_recovered(side: str) -> None:
    clock = Clock()
    guard, pub, fol = _parts(clock)
    t0 = clock.now
    if side == "deliveries":
        pub.undelivered_since = t0
    else:
        fol.unread_since = t0
    clock.now += 60.0
    assert guard.due() is not None and ("deliver" if side == "deliveries" else "read") in (
        guard.due() or ""
    )

    def back() -> None:  # runwatch reachable: the spool drained, then the reader reads
        pub.undelivered_since, fol.unread_since = None, None
        pub.delivered_at = clock.now

    def read() -> None:
        fol.read_ok_at = clock.now

    clock.at = [(t0 + 100.0, back), (t0 + 101.0, read)]
    waits: list[float] = []
    looks: list[float] = []
    stop = guard.hold(
        7, lambda: looks.append(clock.now) or False, waiting=lambda: waits.append(clock.now)
    )
    assert stop is False
    # released at the first look after a read begun once the spool was drained, not before
    assert t0 + 101.0 <= clock.now < t0 + 101.0 + 2 * guard.poll_s
    assert guard.holds == 1 and guard.held_s == pytest.approx(clock.now - (t0 + 60.0))
    assert waits and looks[-1] == clock.now  # keepalive while held; commands read at release
    assert not guard.holding


def test_deliveries_back_but_no_read_since_keeps_it_held() -> None:
    clock = Clock()
    guard, pub, fol = _parts(clock)
    pub.undelivered_since = clock.now - 61
    fol.read_ok_at = clock.now  # the reader was fine all along ...
    pub_back = clock.now + 5

    def drained() -> None:
        pub.undelivered_since, pub.delivered_at = None, clock.now

    clock.at = [(pub_back, drained)]
    fol_reads = threading.Event()

    def act() -> bool:  # ... and reads on every poll: the first begun after the drain counts
        if clock.now >= pub_back + 1.0:
            fol.read_ok_at = clock.now
            fol_reads.set()
        return False

    assert guard.hold(3, act) is False
    assert fol_reads.is_set() and clock.now >= pub_back + 1.0


def test_a_cancel_read_while_held_stops_and_a_close_releases() -> None:
    clock = Clock()
    guard, pub, _fol = _parts(clock)
    pub.undelivered_since = clock.now - 600  # writes still fail, but the reader reads
    calls: list[int] = []
    assert guard.hold(4, lambda: calls.append(1) or len(calls) >= 3) is True
    assert len(calls) == 3
    closed: list[int] = []
    assert guard.hold(5, lambda: False, closed=lambda: closed.append(1) or len(closed) > 2) is False
    assert guard.holds == 2


def test_a_long_hold_says_so_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="runwatch.hooks")
    clock = Clock()
    guard, _pub, fol = _parts(clock)
    fol.unread_since = clock.now - 60

    def back() -> None:
        fol.unread_since, fol.read_ok_at = None, clock.now

    clock.at = [(clock.now + 150, back)]
    guard.hold(9, lambda: False)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "HELD at step 9" in errors[0] and "pause_when_unmonitored_s=60" in errors[0]
    assert sum("still HELD" in m for m in errors) == 2  # at 60 s and 120 s
    assert any("released at step 9" in r.getMessage() for r in caplog.records)


def test_the_option_is_checked_and_can_be_turned_off(tmp_path: Path) -> None:
    assert check_limit(None) is None and check_limit(5) == 5.0
    for bad in (0, -1, float("nan"), float("inf"), True, "300"):
        with pytest.raises(ValueError):
            check_limit(bad)  # type: ignore[arg-type]
    kw = dict(log=tmp_path / "log", spool=tmp_path / "spool", install_exit_hooks=False)
    with pytest.raises(ValueError, match="pause_when_unmonitored_s"):
        RunwatchHook("r", "t", pause_when_unmonitored_s=0, **kw)  # type: ignore[arg-type]
    on = RunwatchHook("r", "t", **kw)  # type: ignore[arg-type]
    assert on.unmonitored is not None
    assert on.unmonitored.limit_s == DEFAULT_PAUSE_WHEN_UNMONITORED_S == 300.0
    off = RunwatchHook("r", "t", pause_when_unmonitored_s=None, **kw)  # type: ignore[arg-type]
    deaf = RunwatchHook("r", "t", follow_commands=False, **kw)  # type: ignore[arg-type]
    assert off.unmonitored is None and deaf.unmonitored is None
    for h in (on, off, deaf):
        h.close(2)


def test_the_spool_is_retried_within_two_seconds_and_at_once_when_asked(tmp_path: Path) -> None:
    assert MAX_RETRY_S <= 2.0
    pub = Publisher(Target.embedded(tmp_path / "log"), tmp_path / "spool")
    try:
        assert pub.max_retry_s == MAX_RETRY_S
        pub.stats.mode = "spooling"  # as after an outage, with the back-off at its cap
        pub._backoff, pub._next_probe = pub.max_retry_s, time.monotonic() + 3600
        pub.retry_now()
        deadline = time.monotonic() + 10
        while pub.stats.mode != "direct":
            assert time.monotonic() < deadline, "retry_now did not ship the spool at once"
            time.sleep(0.02)
        assert pub.undelivered_since is None and pub.delivered_at is not None
    finally:
        pub.close(5)


def test_a_real_hook_is_held_while_its_log_is_away_and_released_when_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwatch.hooks")
    blocker = tmp_path / "mnt"
    blocker.write_text("not a directory")  # the log's parent is a file: no log can be made
    hook = RunwatchHook(
        "r", "t", log=blocker / "log", spool=tmp_path / "spool", retry_s=0.1,
        install_exit_hooks=False, command_poll_s=0.05, pause_when_unmonitored_s=1.0,
    )  # fmt: skip
    hook.start()
    steps: list[int] = []
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set() and step < 100_000:
            step += 1
            hook.log({"reward": 0.1}, step=step)
            hook.step_done(step, wall_s=0.01)
            steps.append(step)
            if hook.obey(step):
                return
            time.sleep(0.01)

    t = threading.Thread(target=train, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not hook.stats().get("unmonitored_holding"):
        assert time.monotonic() < deadline, f"never held: {hook.stats()}"
        time.sleep(0.05)
    held_at = len(steps)
    time.sleep(1.5)
    assert len(steps) == held_at, "trained on while held"
    blocker.unlink()  # the log is back
    deadline = time.monotonic() + 20
    while len(steps) <= held_at:
        assert time.monotonic() < deadline, f"never released: {hook.stats()}"
        time.sleep(0.05)
    stop.set()
    t.join(10)
    stats = hook.stats()
    assert stats["unmonitored_holds"] == 1 and stats["unmonitored_held_s"] >= 1.5
    assert stats["mode"] == "direct" and stats["shipped_from_spool"] > 0
    assert any("HELD at step" in r.getMessage() for r in caplog.records)
    assert hook.close(10).left_in_spool == 0
