"""A gate's pause is shown on a busy plane (the read model's live follower over a real
embedded log, as ``runwatch serve api`` runs it).

Found by review: the follower released a run held at the terminal barrier only when a
poll came back empty for ``settle_s``, or when alerts, rewards and checkpoints had all
moved past it in event time. Where other runs keep writing telemetry (healthy hooked runs:
no alert, reward or checkpoint fact), neither happened: the gated run's ``RunPaused`` was
never folded, no ``RunStateChanged(PAUSED_BY_GATE)`` was derived (the customer's webhook
never told), and the customer's resume was refused "the run is not paused". A run is now
released once held ``settle_s`` by the follower's clock, busy or not.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

from events.catalog.lifecycle import RunPaused, RunStarted, RunSubmitted
from events.catalog.trainer import StepPhaseTimed
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from projections.store import InMemoryReadModel
from runwatch.hosting.follow import follow
from runwatch.hosting.read_model import read_model_host

RUN = "acme:gated"


def _ev(cls: type[EventBase], run: str, step: int | None = None, **kw: object) -> EventBase:
    return cls(
        event_id=uuid.uuid4(), tenant_id=run.split(":")[0], run_id=run, step=step,
        ts=time.time(), producer="hook/x/1", seq=0, **kw,
    )  # fmt: skip


async def test_a_gates_pause_is_shown_while_other_runs_keep_the_log_busy(tmp_path: Path) -> None:
    writer = EmbeddedLog(tmp_path)
    writer.open_sync()
    writer.append_events_sync(
        [_ev(RunSubmitted, RUN, algorithm="grpo"), _ev(RunStarted, RUN)]
        + [_ev(StepPhaseTimed, RUN, s, wall_s=0.1) for s in range(1, 6)]
    )
    busy = threading.Event()
    stop_writing = threading.Event()

    def other_runs() -> None:  # five healthy runs: a step each every 0.1 s, nothing else
        step = 0
        while not stop_writing.is_set():
            step += 1
            writer.append_events_sync(
                [_ev(StepPhaseTimed, f"t{i}:run", step, wall_s=0.1) for i in range(5)]
            )
            busy.set()
            time.sleep(0.1)

    store = InMemoryReadModel()
    host = read_model_host(store)
    backend = EmbeddedLog(tmp_path)
    await backend.start()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(backend, host, stop, publish_to=backend, settle_s=1.0))
    thread = threading.Thread(target=other_runs, daemon=True)
    try:
        await asyncio.sleep(1.5)
        thread.start()
        assert await asyncio.to_thread(busy.wait, 10)
        pause = _ev(
            RunPaused, RUN, 5, reason="paused by controller: kl_blowup (page)",
            request_id=str(uuid.uuid4()), requested_by="controller", refuses_stale_resume=True,
        )  # fmt: skip
        writer.append_events_sync([pause])
        paused_at = time.monotonic()
        shown = None
        while time.monotonic() - paused_at < 15:
            await asyncio.sleep(0.1)
            view = store.get_run(RUN, "acme")
            if view is not None and view.state == "PAUSED_BY_GATE":
                shown = time.monotonic() - paused_at
                break
        assert shown is not None, f"still {store.get_run(RUN, 'acme')} with the log busy"
        assert shown < 8, shown  # settle_s by the follower's clock, plus a loaded box
        assert not host.held
    finally:
        stop_writing.set()
        thread.join(timeout=10)
        stop.set()
        await task
        await backend.close()
    reader = EmbeddedLog(tmp_path, readonly=True)
    reader.open_sync()
    said = [e.to_state for e in reader.iter_events(["runwatch.run-states"]) if e.run_id == RUN]
    assert said[-1] == "PAUSED_BY_GATE", said
