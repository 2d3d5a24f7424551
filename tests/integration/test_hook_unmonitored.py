"""A hooked run whose runwatch is away is held, not trained on unmonitored: a real ingest
gateway (``runwatch serve ingest``, a process of its own) SIGKILLed mid-run and started
again.

Found by review (F2): the hook spooled and kept training with no monitoring and no way to
receive a gate's pause, for as long as the outage lasted; the plane showed the run
RUNNING at its last shipped step. With ``pause_when_unmonitored_s`` the loop stops
advancing within that bound of the outage, and starts again once the gateway is back,
the spool delivered and the commands read; every event reaches the log exactly once
after deduplication by ``event_id``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from producers.hooks import RunwatchHook
from tests.integration.hooks_support import embedded_events
from tests.integration.test_ingest_gateway import A, Gateway

pytestmark = pytest.mark.timeout(240)

LIMIT_S = 2.0


def _wait(cond, timeout_s: float, what: str) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, what
        time.sleep(0.02)
    return time.monotonic() - t0


def test_a_hooked_loop_is_held_while_the_gateway_is_killed_and_resumes_when_it_is_back(
    tmp_path: Path,
) -> None:
    gw = Gateway(tmp_path)
    gw.start()
    hook = RunwatchHook(
        "held", "tenant-a", gateway=gw.url, api_key=A, spool=tmp_path / "spool", gpus=1,
        install_exit_hooks=False, command_poll_s=0.05, retry_s=0.2,
        pause_when_unmonitored_s=LIMIT_S,
    )  # fmt: skip
    steps: list[tuple[int, float]] = []  # (step, monotonic time it was reported)
    stop = threading.Event()
    failed: list[BaseException] = []

    def train() -> None:  # a customer's loop: a step, its facts, the commands at its end
        try:
            step = 0
            while not stop.is_set():
                step += 1
                hook.log({"reward": 0.001 * step, "kl": 0.01}, step=step)
                hook.step_done(step, wall_s=0.02)
                steps.append((step, time.monotonic()))
                if hook.obey(step):
                    return
                time.sleep(0.02)
        except BaseException as exc:
            failed.append(exc)

    try:
        hook.start({"lr": 1e-3})
        loop = threading.Thread(target=train, daemon=True)
        loop.start()
        _wait(lambda: len(steps) >= 20, 60, "the loop never trained")
        assert hook.flush(30) and hook.stats()["mode"] == "direct"

        gw.kill()  # SIGKILL: no goodbye
        killed = time.monotonic()
        _wait(lambda: hook.stats().get("unmonitored_holding"), 30, "the loop was never held")
        last_step, last_at = steps[-1]
        assert last_at - killed <= LIMIT_S + 3.0, (
            f"trained {last_at - killed:.1f} s into the outage, the bound is {LIMIT_S} s"
        )
        time.sleep(3.0)  # held: no step while the gateway is away
        assert steps[-1][0] == last_step, "the loop trained on while runwatch was away"
        assert hook.stats()["mode"] == "spooling" and hook.stats()["spooled"] > 0

        gw.start()  # back (start() returns once it answers)
        back = time.monotonic()
        released_in = _wait(lambda: steps[-1][0] > last_step, 30, "the loop was never released")
        _wait(lambda: len(steps) >= last_step + 20, 60, "the loop did not train on")
        stop.set()
        loop.join(30)
        assert not failed, failed
        hook.finish()
        stats = hook.close(60)
        held = hook.stats()
        assert held["unmonitored_holds"] == 1 and held["unmonitored_held_s"] >= 3.0, held
        assert stats.left_in_spool == 0 and stats.dropped == 0 and stats.failed_jobs == 0
        assert stats.shipped_from_spool > 0

        events = embedded_events(gw.log_dir, "tenant-a:held")
        unique = {e.event_id: e for e in events}
        seqs = sorted(e.seq for e in unique.values())
        assert seqs == list(range(stats.built)), "an event was lost (a gap in seq)"
        sent = len(steps)
        logged = sorted(e.step for e in unique.values() if e.type == "TrainerStepCompleted")
        assert logged == list(range(1, sent + 1)), "a step's row is missing or doubled"
        assert [e.type for e in unique.values()].count("RunCompleted") == 1
        print(
            f"\nheld {held['unmonitored_held_s']:.1f} s (bound {LIMIT_S} s; last step "
            f"{last_at - killed:.1f} s after the SIGKILL); released {released_in:.1f} s after "
            f"the gateway was back (started {back - killed:.1f} s after the kill); "
            f"{sent} steps logged, {stats.built} events built, {len(unique)} stored, "
            f"{len(events) - len(unique)} duplicates, {stats.built - len(unique)} lost; "
            f"{stats.spooled} spooled, {stats.shipped_from_spool} shipped from the spool"
        )
        assert released_in < 10.0, f"released {released_in:.1f} s after the gateway was back"
    finally:
        stop.set()
        hook.close(5)
        gw.stop()
