"""Duplicates, out-of-order steps, missing eval data and NaN metrics."""

from __future__ import annotations

import math

from events.codec import encode
from stream_processors.detectors import RunHealthFold
from tests.unit.stream_processors.detectors._builders import (
    Run,
    detector_state,
    fired,
    fold_all,
    resolved,
)


def _collapse_run(run: Run, steps: int = 200, at: int = 120) -> list:
    return [
        run.step(s, reward_mean=(0.5 + 0.01 * math.sin(s)) if s < at else 0.0) for s in range(steps)
    ]


def test_duplicate_event_is_absorbed() -> None:
    run = Run()
    events = _collapse_run(run)
    doubled = [e for ev in events for e in (ev, ev)]  # every event redelivered (same id)
    fold = RunHealthFold()
    once_state, once = fold_all(events, fold)
    twice_state, twice = fold_all(doubled, fold)
    assert [encode(e) for e in once] == [encode(e) for e in twice]
    assert len(fired(once, "reward_explosion_collapse")) == 1
    assert twice_state.late == len(events) and once_state.late == 0
    assert fold.dump_state(twice_state._replace(late=0)) == fold.dump_state(once_state)


def test_late_and_repeated_steps_are_not_folded_and_are_counted() -> None:
    run = Run()
    events = _collapse_run(run)
    late = [run.step(50, reward_mean=99.0), run.step(119, reward_mean=-5.0)]
    shuffled = events[:130] + late + events[130:]  # a rewound producer re-sends old steps
    fold = RunHealthFold()
    state, derived = fold_all(shuffled, fold)
    clean_state, clean = fold_all(events, fold)
    assert [encode(e) for e in derived] == [encode(e) for e in clean]
    assert state.late == 2 and state.marks[0] == 199
    assert fold.dump_state(state._replace(late=0)) == fold.dump_state(clean_state)


def test_step_less_telemetry_is_counted_not_folded() -> None:
    run = Run()
    state, derived = fold_all([run.step(None, reward_mean=1.0), run.eval(None, 0.3)])
    assert state.unplaced == 2 and not derived


def test_gaps_in_steps_use_real_step_numbers() -> None:
    run = Run()  # logging every 5th step: windows still aligned on step numbers
    events = [run.step(s, entropy=2.0 if s < 150 else 2.0 * math.exp(-(s - 150) / 40))
              for s in range(0, 400, 5)]  # fmt: skip
    # one point every 5 steps: the forecast's trend is per step, so the gaps do not matter
    _, derived = fold_all(events)
    alerts = fired(derived, "entropy_collapse")
    assert alerts and 150 <= alerts[0].step <= 250


def test_missing_eval_blinds_hacking_and_is_reported() -> None:
    run = Run()
    events = [run.step(s, reward_mean=0.2 + 0.004 * s) for s in range(300)]
    _, derived = fold_all(events)
    assert not fired(derived, "reward_hacking")
    gap = fired(derived, "eval_gate_missing")
    assert len(gap) == 1 and gap[0].step == 200 and gap[0].routing == "advisory"


def test_sparse_eval_still_detects_hacking_and_eval_resolves_gap_alert() -> None:
    run = Run()
    events = []
    for s in range(300):
        events.append(run.step(s, reward_mean=0.2 + 0.003 * s))
        if s % 10 == 9 and (s < 40 or s >= 250):  # a gap, then an eval every 10 steps
            events.append(run.eval(s, 0.5 - 0.004 * max(0, s - 150)))
    _, derived = fold_all(events)
    # the cadence learned from the first two evals (10 steps) is judged 1.5x late
    assert [a.step for a in fired(derived, "eval_gate_missing")] == [39 + 15]
    assert [r.step for r in resolved(derived, "eval_gate_missing")] == [259]
    hacking = fired(derived, "reward_hacking")  # the first eval after the gap is judged
    assert len(hacking) == 1 and hacking[0].step == 259 and hacking[0].window_start == 39


def test_nan_is_reported_once_and_does_not_poison_windows() -> None:
    run = Run()
    events = []
    for s in range(200):
        r = math.nan if s in (60, 61, 65) else (0.5 + 0.01 * math.sin(s) if s < 150 else 0.0)
        loss = math.inf if s == 61 else 0.1
        events.append(run.step(s, reward_mean=r, loss=loss, extra={"perf/mfu": 0.4}))
    fold = RunHealthFold()
    state, derived = fold_all(events, fold)
    nan = fired(derived, "nan_metric")
    assert len(nan) == 1 and nan[0].step == 60 and "reward_mean=nan" in nan[0].reason
    assert detector_state(fold, state, "nan_metric").count == 0  # episode closed
    assert [r.step for r in resolved(derived, "nan_metric")] == [75]  # 10 clean steps
    collapse = fired(derived, "reward_explosion_collapse")
    assert len(collapse) == 1 and 150 <= collapse[0].step <= 153  # windows stayed finite


def test_nan_in_extra_and_other_event_types_is_reported() -> None:
    run = Run()
    events = [
        run.step(0, extra={"perf/mfu": math.nan, "note": "x"}),
        run.eval(0, math.nan),
        run.rollout(0, truncation_rate=math.nan),
    ]
    _, derived = fold_all(events)
    nan = fired(derived, "nan_metric")
    assert len(nan) == 1 and "perf/mfu=nan" in nan[0].reason


def test_the_ids_kept_at_one_step_are_bounded_and_near_repeats_still_absorbed() -> None:
    """Found by review: the fold kept the id of every fact of a type at its latest step, a
    tuple scanned and copied per fact, so a producer sending 20,000 facts for one step
    cost quadratic time (75 % of the processors', every tenant's alerts behind it). At
    most ``MAX_IDS_AT_MARK`` are kept; a repeat among them is still absorbed."""
    from stream_processors.detectors.run_health import _ORDERED, MAX_IDS_AT_MARK

    run = Run()
    evals = [run.eval(7, 0.1 * (i % 5)) for i in range(3 * MAX_IDS_AT_MARK)]
    fold = RunHealthFold()
    state, _ = fold_all(evals, fold)
    idx = _ORDERED["EvalGateScored"][0]
    assert len(state.at_mark[idx]) == MAX_IDS_AT_MARK and state.late == 0
    state, out = fold.apply(state, evals[-1])  # a redelivery of a recent one: absorbed
    assert out == () and state.late == 1


def test_a_new_algorithm_name_every_step_does_not_grow_the_shared_fold() -> None:
    """Found by review: ``algorithm`` is the producer's free text and the fold's settings
    and dispatch caches (one fold instance serves every run and tenant) kept an entry per
    name: a tenant sending a new one each step grew them 4.6 KB an event. They are keyed
    by the names the catalog tells apart (settings) and bounded (plans); the alerts are
    what the same run with one unknown name gets."""
    from stream_processors.detectors.run_health import MAX_PLANS

    run = Run()
    steady = _collapse_run(run)
    named = [e.model_copy(update={"algorithm": f"algo-{i}"}) for i, e in enumerate(steady)]
    fold = RunHealthFold()
    _, out = fold_all(named, fold)
    assert len(fold._settings) <= 1 + len(fold.catalog.algorithms)
    assert len(fold._plans) <= MAX_PLANS
    _, same = fold_all([e.model_copy(update={"algorithm": "algo-x"}) for e in steady])
    assert [(a.type, a.alert_id) for a in out] == [(a.type, a.alert_id) for a in same]
