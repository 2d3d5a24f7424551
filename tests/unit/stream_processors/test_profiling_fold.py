"""The profiling fold on hand-built trace directories with known answers (seed 003)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from events import (
    RolloutBatchCompleted,
    StepProfiled,
    StragglerDetected,
    WorkerProfiled,
    encode,
)
from events.envelope import EventBase
from stream_processors.profiling import ProfilingConfig, ProfilingFold
from tests.trace_dirs import events_of, line, request, write_dir

approx = pytest.approx


def run_fold(
    events: Iterable[EventBase], fold: ProfilingFold | None = None, flush: bool = True
) -> list[EventBase]:
    fold = fold or ProfilingFold()
    state = fold.initial()
    out: list[EventBase] = []
    for ev in events:
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    if flush:
        state, derived = fold.flush(state)
        out.extend(derived)
    return out


def only(out: list[EventBase], cls: type, step: int | None = None) -> list:
    return [e for e in out if isinstance(e, cls) and (step is None or e.step == step)]


def test_known_long_tail(tmp_path: Path) -> None:
    # 10 requests on 2 workers done at 1..9 s and one at 50 s: 90 % are done by 40 % of
    # the rollout (20 s), 80 % by 8 s, and the slowest is r9 on worker 1.
    done = [1, 2, 3, 4, 5, 6, 7, 8, 9, 50]
    lines = [request(1, i % 2, f"r{i}", t) for i, t in enumerate(done)]
    out = run_fold(events_of(write_dir(tmp_path, lines)))
    (sp,) = only(out, StepProfiled)
    assert sp.step == 1 and sp.requests == 10 and sp.completed_requests == 10
    assert sp.rollout_s == approx(50, abs=1e-5)
    assert sp.done_by_40pct == approx(0.9)
    assert sp.t80_s == approx(8, abs=1e-5)
    assert sp.t80_frac == approx(8 / 50, abs=1e-6)
    assert sp.p50_s == approx(5, abs=1e-5)
    assert (sp.slowest_request_id, sp.slowest_request_worker) == ("r9", "1")
    assert sp.slowest_request_s == approx(50, abs=1e-5)
    assert len(sp.completion_quantiles_s) == 101
    assert sp.completion_quantiles_s[0] == approx(1, abs=1e-5)
    assert sp.completion_quantiles_s[80] == approx(8, abs=1e-5)
    assert sp.completion_quantiles_s[100] == approx(50, abs=1e-5)


def test_straggler_worker_and_barrier_wait(tmp_path: Path) -> None:
    # Workers finish at 10, 10, 12 and 40 s: the median is 11 s, worker 3 is beyond 2x.
    finish = {0: 10.0, 1: 10.0, 2: 12.0, 3: 40.0}
    lines = []
    for w, end in finish.items():
        lines += [request(3, w, f"w{w}-a", end / 2), request(3, w, f"w{w}-b", end)]
        lines.append(line(3, w, "barrier_wait_duration", end, 40.0 - end))
    out = run_fold(events_of(write_dir(tmp_path, lines)))
    (sp,) = only(out, StepProfiled)
    assert sp.slowest_worker == "3" and sp.slowest_worker_s == approx(40, abs=1e-5)
    assert sp.median_worker_s == approx(11, abs=1e-5)
    assert sp.barrier_wait_total_s == approx(30 + 30 + 28, abs=1e-4)
    assert sp.straggler_workers == ("3",)
    (st,) = only(out, StragglerDetected)
    assert st.worker == "3" and st.step == 3
    assert st.ratio == approx(40 / 11, rel=1e-5)
    assert st.barrier_wait_imposed_s == approx((40 - 12) * 3, abs=1e-4)
    assert st.slowest_request_id == "w3-b"
    assert "worker 3" in st.reason
    workers = {w.worker: w for w in only(out, WorkerProfiled)}
    assert sorted(workers) == ["0", "1", "2", "3"]
    assert workers["0"].barrier_wait_s == approx(30, abs=1e-5)
    assert workers["3"].barrier_wait_s == approx(0, abs=1e-9)
    assert workers["2"].completion_s == approx(12, abs=1e-5)


def test_no_straggler_when_workers_are_even(tmp_path: Path) -> None:
    lines = [request(1, w, f"w{w}", 10.0 + w) for w in range(4)]
    out = run_fold(events_of(write_dir(tmp_path, lines)))
    assert not only(out, StragglerDetected)
    assert only(out, StepProfiled)[0].straggler_workers == ()


def test_known_aborted_share_and_cost(tmp_path: Path) -> None:
    # 8 requests complete; 2 are cancelled by over-sampling 20 s after the rollout start
    # (verl logs the time since the start) and padded for 0.5 s each.
    lines = [request(2, 0, f"r{i}", 2.0 + i) for i in range(8)]
    for rid in ("x1", "x2"):
        lines.append(
            line(2, 0, "aborted_request_with_cancelled_error", 0.0, 20.0, {"request_id": rid})
        )
        lines.append(
            line(
                2, 0, "aborted_request_with_cancelled_error_padding", 20.0, 0.5, {"request_id": rid}
            )
        )
    out = run_fold(events_of(write_dir(tmp_path, lines)))
    (sp,) = only(out, StepProfiled)
    assert (sp.requests, sp.completed_requests, sp.aborted_requests) == (10, 8, 2)
    assert sp.aborted_share == approx(0.2)
    assert sp.aborted_cost_s == approx(41.0, abs=1e-4)
    assert sp.padding_s == approx(1.0, abs=1e-6)
    assert sp.rollout_s == approx(9.0, abs=1e-5)  # aborted requests never "complete"
    (wp,) = only(out, WorkerProfiled)
    assert wp.aborted_requests == 2 and wp.completion_s == approx(20.5, abs=1e-5)


def test_event_share_table(tmp_path: Path) -> None:
    lines = [
        line(1, 0, "preprocessing_duration", 0.0, 2.0),
        request(1, 0, "r0", 8.0, start=2.0),
        line(1, 0, "barrier_wait_duration", 8.0, 2.0),
        line(1, 0, "async_rollout_with_monitoring_duration", 2.0, 6.0),  # encloses r0
    ]
    out = run_fold(events_of(write_dir(tmp_path, lines)))
    (sp,) = only(out, StepProfiled)
    share = dict(sp.event_share)
    assert share == approx(
        {"preprocessing_duration": 0.2, "engine_async_generate": 0.6, "barrier_wait_duration": 0.2}
    )
    assert dict(sp.event_seconds)["async_rollout_with_monitoring_duration"] == approx(6.0)
    assert sp.step_span_s == approx(10.0, abs=1e-5)


def test_turn_counts_and_engine_time_per_turn(tmp_path: Path) -> None:
    lines = [
        line(1, 0, "engine_async_generate", 0.0, 3.0, {"request_id": "a", "turn": 1}),
        line(1, 0, "tool_call", 3.0, 1.0, {"request_id": "a", "turn": 1}),
        line(1, 0, "engine_async_generate", 4.0, 5.0, {"request_id": "a", "turn": 2}),
        line(1, 0, "engine_async_generate", 0.0, 4.0, {"request_id": "b", "turn": 1}),
    ]
    out = run_fold(events_of(write_dir(tmp_path, lines)))
    (sp,) = only(out, StepProfiled)
    assert dict(sp.turn_histogram) == {"1": 1, "2": 1}
    assert dict(sp.engine_s_by_turn) == approx({"1": 3.5, "2": 5.0})
    assert dict(sp.request_s_by_turns) == approx({"1": 4.0, "2": 9.0}, abs=1e-5)


def test_rollout_quality_feeds_the_drift_input(tmp_path: Path) -> None:
    lines = [
        request(5, 0, "a", 1.0, completion_tokens=100, finish_reason="stop"),
        request(5, 0, "b", 2.0, completion_tokens=600, finish_reason="length"),
        request(
            5, 1, "c", 3.0, completion_tokens=200, finish_reason="stop", parse_error="no \\boxed"
        ),
        request(5, 1, "d", 4.0, completion_tokens=300, finish_reason="stop", policy_version=4),
    ]
    out = run_fold(events_of(write_dir(tmp_path, lines)))
    (batch,) = only(out, RolloutBatchCompleted)
    assert batch.TOPIC == "runwatch.telemetry"
    assert (batch.step, batch.policy_version, batch.num_sequences) == (5, 4, 4)
    assert batch.mean_length == approx(300) and batch.max_length == 600
    assert batch.truncation_rate == approx(0.25) and batch.unparseable_rate == approx(0.25)
    assert batch.tokens_generated == 1200


def test_no_quality_summary_without_token_counts(tmp_path: Path) -> None:
    out = run_fold(events_of(write_dir(tmp_path, [request(1, 0, "a", 1.0)])))
    assert not only(out, RolloutBatchCompleted)
    # tokens without a policy version: no summary (a guessed version would hide a frozen
    # weight sync from the staleness detector)
    lines = [request(1, 0, "a", 1.0, completion_tokens=5)]
    assert not only(run_fold(events_of(write_dir(tmp_path / "a", lines))), RolloutBatchCompleted)
    off = ProfilingFold(ProfilingConfig(emit_batch_summaries=False))
    lines = [request(1, 0, "a", 1.0, completion_tokens=5, policy_version=0)]
    assert not only(
        run_fold(events_of(write_dir(tmp_path / "b", lines)), off), RolloutBatchCompleted
    )


def steps_dir(root: Path, spans: dict[int, float]) -> list:
    lines = []
    for step, span in spans.items():
        lines += [request(step, w, f"s{step}w{w}", span) for w in range(2)]
    return list(events_of(write_dir(root, lines)))


def test_a_step_is_finalized_by_the_next_step_or_the_flush(tmp_path: Path) -> None:
    events = steps_dir(tmp_path, {1: 5.0, 2: 5.0})
    fold = ProfilingFold()
    state = fold.initial()
    emitted: list[list[EventBase]] = []
    for ev in events:
        state, derived = fold.apply(state, ev)
        emitted.append(list(derived))
    assert [len(d) > 0 for d in emitted] == [False, False, True, False]
    assert {e.step for e in emitted[2]} == {1}
    # a late trace of step 1 is counted, not folded in (replays stay deterministic)
    state, derived = fold.apply(
        state, events[0].model_copy(update={"event_id": events[1].event_id})
    )
    assert derived == () and state.late_events == 1
    state, derived = fold.flush(state)
    (sp2,) = only(list(derived), StepProfiled)
    assert sp2.step == 2 and sp2.late_events == 1
    assert fold.flush(state) == (state, ())


def test_lateness_keeps_a_step_open_longer(tmp_path: Path) -> None:
    events = steps_dir(tmp_path, {1: 5.0, 2: 5.0, 3: 5.0})
    fold = ProfilingFold(ProfilingConfig(lateness_steps=1))
    state = fold.initial()
    first_seen = {}
    for i, ev in enumerate(events):
        state, derived = fold.apply(state, ev)
        for d in derived:
            first_seen.setdefault(d.step, i)
    assert first_seen == {1: 4}  # step 1 closes at the first trace of step 3
    # an out-of-order trace of step 2 arriving after step 3 started is still folded in
    state, derived = fold.apply(
        state, events[2].model_copy(update={"event_id": events[0].event_id})
    )
    assert derived == () and state.late_events == 0


def test_slow_step_against_recent_median(tmp_path: Path) -> None:
    out = run_fold(steps_dir(tmp_path, {1: 10.0, 2: 11.0, 3: 10.0, 4: 40.0, 5: 12.0}))
    flags = {e.step: e.slow_step for e in only(out, StepProfiled)}
    assert flags == {1: False, 2: False, 3: False, 4: True, 5: False}


def test_replay_is_byte_identical_and_state_survives_a_restart(tmp_path: Path) -> None:
    events = steps_dir(tmp_path, {1: 5.0, 2: 30.0, 3: 6.0})
    first = [encode(e) for e in run_fold(events)]
    assert first == [encode(e) for e in run_fold(events)]
    # stop after 3 events, persist, restore into a fresh fold, go on
    fold = ProfilingFold()
    state = fold.initial()
    out: list[EventBase] = []
    for ev in events[:3]:
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    restored = ProfilingFold().load_state(fold.dump_state(state))
    assert restored == state
    fresh = ProfilingFold()
    state = restored
    for ev in events[3:]:
        state, derived = fresh.apply(state, ev)
        out.extend(derived)
    out.extend(fresh.flush(state)[1])
    assert [encode(e) for e in out] == first


def test_ignores_other_events_and_counts_unstepped(tmp_path: Path) -> None:
    (ev,) = steps_dir(tmp_path, {1: 1.0})[:1]
    fold = ProfilingFold()
    state, derived = fold.apply(fold.initial(), ev.model_copy(update={"step": None}))
    assert derived == () and state.unstepped_events == 1
    sp = only(run_fold([ev]), StepProfiled)[0]
    state2, derived2 = fold.apply(fold.initial(), sp)
    assert derived2 == () and state2 == fold.initial()
