"""The rollout tracer: spans, decorators, request/turn context, aborts, batching."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from events import RolloutTraceRecorded, StepProfiled
from events.log.embedded import EmbeddedLog
from producers.emitter import Emitter
from producers.sinks import EmbeddedSink, MemorySink
from producers.tracing import RolloutTracer
from stream_processors.profiling import ProfilingFold


class Clock:
    """A fake clock: every reading advances by ``tick`` seconds (wall and monotonic)."""

    def __init__(self, start: float = 1000.0, tick: float = 0.5) -> None:
        self.now = start
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


class CountingSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, events) -> None:  # type: ignore[no-untyped-def]
        self.writes.append(len(events))
        super().write(events)


def make(batch_size: int = 100, **kw):  # type: ignore[no-untyped-def]
    sink = CountingSink()
    emitter = Emitter(
        sink, tenant_id="acme", run_id="run-1", producer="rollout/0", batch_size=batch_size
    )
    clock = Clock()
    tracer = RolloutTracer(emitter, worker=0, step=3, clock=clock, perf=clock, **kw)
    return tracer, sink


def traces(sink: MemorySink) -> list[RolloutTraceRecorded]:
    return [e for e in sink.events if isinstance(e, RolloutTraceRecorded)]


def test_a_span_times_one_event_with_its_request_and_turn() -> None:
    synced = []
    tracer, sink = make(synchronize=lambda: synced.append(1))
    with tracer.request("req-1"), tracer.turn(2), tracer.span("engine_async_generate") as span:
        span.set(completion_tokens=120, finish_reason="stop", node="gpu-1", ids=[1, 2])
    tracer.flush()
    (ev,) = traces(sink)
    assert (ev.step, ev.worker, ev.request_id, ev.turn) == (3, "0", "req-1", 2)
    assert ev.event_name == "engine_async_generate"
    # clock readings: start wall 1000.5, start perf 1001.0, end perf 1001.5
    assert ev.started_at == 1000.5 and ev.duration_s == 0.5 and ev.ts == 1001.0
    assert (ev.completion_tokens, ev.finish_reason) == (120, "stop")
    assert dict(ev.extra) == {"node": "gpu-1", "ids": "[1, 2]"}
    assert synced == [1, 1]  # before each clock reading, as the seed prescribes
    assert ev.run_id == "run-1" and ev.producer == "rollout/0" and ev.seq == 0
    assert ev.policy_version is None
    tracer.policy_version = 7
    with tracer.span("engine_async_generate", request_id="r2"):
        pass
    tracer.flush()
    assert traces(sink)[-1].policy_version == 7


def test_worker_level_spans_have_no_request() -> None:
    tracer, sink = make()
    with tracer.span("preprocessing_duration"):
        pass
    tracer.flush()
    (ev,) = traces(sink)
    assert ev.request_id is None and ev.turn is None


def test_decorator_times_sync_and_async_functions() -> None:
    tracer, sink = make()

    @tracer.traced("reward_calc", request_id_from=lambda req: req["id"])
    def reward(req: dict) -> float:
        return 1.0

    @tracer.traced()
    async def engine_async_generate(prompt: str) -> str:
        await asyncio.sleep(0)
        return prompt.upper()

    assert reward({"id": "r7"}) == 1.0
    with tracer.request("r8"):
        assert asyncio.run(engine_async_generate("hi")) == "HI"
    assert engine_async_generate.__name__ == "engine_async_generate"
    tracer.flush()
    a, b = traces(sink)
    assert (a.event_name, a.request_id) == ("reward_calc", "r7")
    assert (b.event_name, b.request_id) == ("engine_async_generate", "r8")


def test_concurrent_requests_on_one_loop_never_mix() -> None:
    tracer, sink = make()

    async def one_request(rid: str, turns: int) -> None:
        with tracer.request(rid):
            for t in range(1, turns + 1):
                with tracer.turn(t):
                    async with tracer.span("engine_async_generate"):
                        await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(one_request(f"r{i}", i) for i in range(1, 4)))

    asyncio.run(main())
    tracer.flush()
    seen = sorted((e.request_id, e.turn) for e in traces(sink))
    assert seen == [("r1", 1), ("r2", 1), ("r2", 2), ("r3", 1), ("r3", 2), ("r3", 3)]


def test_cancellation_marks_the_request_aborted_and_errors_are_recorded() -> None:
    tracer, sink = make()

    async def slow() -> None:
        with tracer.request("over-sampled"):
            async with tracer.span("engine_async_generate"):
                await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(slow())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    with pytest.raises(ZeroDivisionError), tracer.span("reward_calc", request_id="r1"):
        1 / 0  # noqa: B018
    tracer.flush()
    cancelled, failed = traces(sink)
    assert cancelled.aborted and cancelled.request_id == "over-sampled"
    assert not failed.aborted and dict(failed.extra) == {"error": "ZeroDivisionError"}


def test_events_leave_in_batches() -> None:
    tracer, sink = make(batch_size=4)
    for i in range(10):
        tracer.record("tool_call", 0.25, request_id=f"r{i}")
    assert sink.writes == [4, 4]
    tracer.flush()
    assert sink.writes == [4, 4, 2]
    assert [e.seq for e in traces(sink)] == list(range(10))
    assert traces(sink)[0].duration_s == 0.25


def test_traced_rollout_lands_in_a_real_log_and_profiles(tmp_path: Path) -> None:
    """Two workers trace two steps into an embedded log; the fold profiles them."""
    sink = EmbeddedSink(tmp_path / "log")
    counter = itertools.count()
    for worker, slow in ((0, 1.0), (1, 6.0)):
        emitter = Emitter(sink, tenant_id="acme", run_id="run-1", producer=f"rollout/{worker}")
        clock = Clock(start=1000.0, tick=slow)
        tracer = RolloutTracer(emitter, worker=worker, clock=clock, perf=clock)
        for _ in range(2):
            tracer.next_step()
            clock.now = 1000.0 + 100 * tracer.step
            for _r in range(3):
                with tracer.request(f"r{next(counter)}"), tracer.span("engine_async_generate"):
                    pass
            tracer.flush()
    log = EmbeddedLog(tmp_path / "log", readonly=True)
    log.open_sync()
    events = sorted(log.iter_events(["runwatch.traces"]), key=lambda e: (e.step, e.ts))
    fold = ProfilingFold()
    state, out = fold.initial(), []
    for ev in events:
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    out.extend(fold.flush(state)[1])
    profiles = [e for e in out if isinstance(e, StepProfiled)]
    assert [p.step for p in profiles] == [1, 2]
    assert all(p.requests == 6 and p.slowest_worker == "1" for p in profiles)
