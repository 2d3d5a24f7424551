"""A gate's pause that the run never answers pages (review F1), on real processes.

A real embedded log, the real ``runwatch process`` (detectors and run controller) and a
``RunwatchHook``-driven loop whose KL climbs past the ``kl_blowup`` ceiling. Found by
review: the documented plain-hook loop (``log`` + ``step_done``, no ``hook.obey()``)
trained and billed 52 steps past the gate's ``PauseRequested`` and nothing noticed. Now the
controller pages ``pause_unanswered`` a few steps after the pause (and resolves it when
the run ends); a loop that obeys pauses and never gets that page.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from events.catalog.control import PauseRequested
from events.catalog.derived import AlertFired, AlertResolved
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from producers.commands import issue
from producers.hooks import RunwatchHook

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("RUNWATCH_LOG_DIR", None)
ENV.pop("RUNWATCH_KAFKA", None)
DETECTOR = "pause_unanswered"
#: the plain loop's step: the page needs 2 steps and 3 s of the run's clock past the pause
STEP_S = 0.5


def _facts(log: Path, run: str) -> list[EventBase]:
    if not log.is_dir():
        return []
    reader = EmbeddedLog(log, readonly=True)
    reader.open_sync()
    return [
        e
        for e in reader.iter_events(reader.topic_names())
        if isinstance(e, EventBase) and e.run_id == run
    ]


def _unanswered(facts: list[EventBase]) -> list[EventBase]:
    return [e for e in facts if getattr(e, "detector", "") == DETECTOR]


def _wait(what: str, cond, timeout: float = 90.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = cond()
        if found:
            return found
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _hook(tmp: Path, log: Path, run: str, **kw: object) -> RunwatchHook:
    return RunwatchHook(
        run, tenant_id="acme", log=log, spool=tmp / f"spool-{run}", gpus=8,
        install_exit_hooks=False, **kw,
    )  # fmt: skip


def _row(step: int) -> dict[str, float]:
    return {"reward": step / 100, "kl": step / 10}  # past the kl_blowup ceiling at ~7


@contextlib.contextmanager
def _processor(tmp: Path, log: Path) -> Iterator[subprocess.Popen[str]]:
    """The real ``runwatch process`` following ``log`` (its output in process.out)."""
    with open(tmp / "process.out", "w") as sink:
        processor = subprocess.Popen(
            [sys.executable, "-m", "runwatch.cli.main", "process", "--log", str(log)],
            cwd=tmp, env=ENV, stdout=sink, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    try:
        yield processor
    finally:
        if processor.poll() is None:
            processor.terminate()
            processor.wait(30)


def _until_paged(
    hook: RunwatchHook,
    log: Path,
    run: str,
    processor: subprocess.Popen[str],
    on_pause: Callable[[], None] = lambda: None,
) -> tuple[int | None, int, list[EventBase]]:
    """The README's plain loop (log + step_done, never obey()) until the run is paged:
    the loop's step when the gate's pause was on the log (``on_pause`` is called then),
    the last step, and the page ([] after 400 steps)."""
    at_pause: int | None = None
    page: list[EventBase] = []
    step = 0
    for step in range(400):
        hook.log(_row(step), step=step)
        hook.step_done(step, wall_s=10.0)
        hook.flush(10)
        time.sleep(STEP_S)
        facts = _facts(log, run)
        if at_pause is None and any(isinstance(e, PauseRequested) for e in facts):
            at_pause = step
            on_pause()
        page = _unanswered(facts)
        if page:
            break
        assert processor.poll() is None, processor.stderr.read() if processor.stderr else ""
    return at_pause, step, page


def test_a_pause_the_run_never_answers_pages_and_one_it_obeys_does_not(tmp_path: Path) -> None:
    log = tmp_path / "log"
    out = tmp_path / "process.out"
    with _processor(tmp_path, log) as processor:
        # 1. the README's plain loop: log + step_done, never obey()
        run = "ignores"
        hook = _hook(tmp_path, log, run)
        hook.start({})
        at_pause, step, page = _until_paged(hook, log, run, processor)
        assert at_pause is not None, "the gate never asked for a pause"
        assert page, f"no {DETECTOR} page in {step} steps (pause on the log at step {at_pause})"
        (fired,) = page
        assert isinstance(fired, AlertFired)
        assert (fired.routing, fired.layer, fired.escalated) == ("page", "run_mechanics", True)
        request = next(e for e in _facts(log, run) if isinstance(e, PauseRequested))
        assert request.actor == "controller" and request.alert_id
        assert fired.alert_id.endswith(str(request.event_id))
        # within a few steps of the pause: past the last step before it was on the log, 2
        # steps and 3 s (6 steps here) allowed, plus a processor pass (0.2 s)
        assert step - at_pause <= 10, (at_pause, step, fired.reason)
        print(f"\ngate's pause on the log at step {at_pause}, {DETECTOR} paged at step {step}")
        for said in (run, f"step {request.step}", request.alert_id, "steps trained since"):
            assert said in fired.reason, (said, fired.reason)
        # it keeps training: still one page
        last = step + 5
        for more in range(step + 1, last + 1):
            hook.log(_row(more), step=more)
            hook.step_done(more, wall_s=10.0)
        hook.finish(step=last)
        hook.close(10)
        resolved = _wait(
            "the run's end did not resolve the page",
            lambda: [e for e in _unanswered(_facts(log, run)) if isinstance(e, AlertResolved)],
        )
        assert resolved[0].alert_id == fired.alert_id and "completed" in resolved[0].reason
        assert len([e for e in _unanswered(_facts(log, run)) if isinstance(e, AlertFired)]) == 1
        _wait(
            "runwatch process did not print the page",
            lambda: f"page     {DETECTOR} run {run}" in out.read_text(),
            30,
        )

        # 2. the same loop obeying: paused within a step or two, never paged
        run = "obeys"
        hook = _hook(tmp_path, log, run, command_poll_s=0.05)
        hook.start({})
        stopped: list[int] = []

        def loop() -> None:
            for step in range(400):
                hook.log(_row(step), step=step)
                hook.step_done(step, wall_s=10.0)
                time.sleep(0.1)
                if hook.obey(step):
                    stopped.append(step)
                    return

        trainer = threading.Thread(target=loop, daemon=True)
        trainer.start()
        _wait("the obeying loop never paused", lambda: any(
            e.type == "RunPaused" for e in _facts(log, run)))  # fmt: skip
        time.sleep(2.0)  # paused: several processor passes, no step
        issue(log, run, "cancel", actor="operator", principal="test", reason="done")
        trainer.join(60)
        assert stopped, "the cancel did not stop the obeying loop"
        hook.close(10)
        time.sleep(1.0)  # the processor's passes over the last facts
        facts = _facts(log, run)
        assert any(isinstance(e, PauseRequested) for e in facts)
        assert _unanswered(facts) == [], [e.reason for e in _unanswered(facts)]  # type: ignore[attr-defined]


def test_a_run_that_says_it_ended_and_trains_on_is_paged(tmp_path: Path) -> None:
    """Found by review: a hooked run that published ``RunCompleted`` as soon as a gate's
    pause was on the log, then trained 50 steps more, was never paged (the end silenced
    the gate). Its steps after the end are training: the pause in flight pages."""
    log = tmp_path / "log"
    with _processor(tmp_path, log) as processor:
        run = "ends-early"
        hook = _hook(tmp_path, log, run)
        hook.start({})

        def end() -> None:  # "completed" (no step said), and it trains on
            hook.finish()
            hook.flush(10)

        ended_at, step, page = _until_paged(hook, log, run, processor, on_pause=end)
        assert ended_at is not None, "the gate never asked for a pause"
        assert page, f"no {DETECTOR} page in {step} steps (said it ended at step {ended_at})"
        assert isinstance(page[0], AlertFired) and page[0].routing == "page"
        assert step - ended_at <= 12, (ended_at, step, page[0].reason)
        print(f"\nsaid it ended at step {ended_at}, {DETECTOR} paged at step {step}")
        hook.close(10)
