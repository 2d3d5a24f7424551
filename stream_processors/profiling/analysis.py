"""The figures of one rollout step, computed from its trace events (pure, no I/O).

:func:`profile_step` takes every :class:`~events.catalog.rollout.RolloutTraceRecorded`
of one run's step (as :func:`observe` flattens them) and returns the payloads of the
derived events (see
:mod:`events.catalog.profile` for what each figure means). Definitions:

- An event *ends* at ``ts`` and *starts* at ``started_at`` (else ``ts - duration_s``).
- A *request* is a ``(worker, request_id)`` pair; worker-level events (no request id)
  count toward event shares and worker busy time, never toward requests.
- A request is *aborted* if any of its events is ``aborted`` or its name contains
  ``"aborted"`` (verl's over-sampling logs ``aborted_request_with_cancelled_error``);
  otherwise it *completed* when its last event ended.
- The step's *origin* is the earliest start of a request-scoped event (of any event when
  no event names a request); completion times are seconds after the origin.
- A worker's *completion* is the end of its last request-scoped event (aborts and
  padding included: the worker is busy until then), or of its last non-barrier event
  when it traced no request. Barrier wait of a worker = slowest completion - its own.
- A *straggler* is a worker whose completion exceeds ``straggler_k x`` the median worker
  completion and the median by at least ``straggler_min_gap_s``.
- Quantiles are nearest-rank: the q-quantile of n sorted values is value
  ``ceil(q * n) - 1`` (the first value for q = 0).
- Event shares: summed duration per event name over the summed durations of the step,
  ``container_events`` (enclosing events) listed in seconds but left out of the shares.
- Engine time is the summed duration of request-scoped events whose name contains one
  of ``engine_markers`` (``"generate"``), per turn; a request's turn count is the number
  of distinct turn indexes its events carry (requests without turns are left out).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from events.catalog.profile import QUANTILE_POINTS
from events.catalog.rollout import RolloutTraceRecorded


@dataclass(frozen=True, slots=True)
class ProfilingConfig:
    """Thresholds of the profiling processor (config, not code)."""

    straggler_k: float = 2.0
    straggler_min_gap_s: float = 1.0
    slow_step_k: float = 2.0
    slow_step_history: int = 20
    slow_step_min_history: int = 3
    lateness_steps: int = 0
    long_tail_at: float = 0.4
    done_share: float = 0.8
    engine_markers: tuple[str, ...] = ("generate",)
    padding_markers: tuple[str, ...] = ("padding",)
    barrier_markers: tuple[str, ...] = ("barrier",)
    abort_markers: tuple[str, ...] = ("aborted",)
    #: Events that enclose others (a worker's whole rollout): listed in ``event_seconds``
    #: but left out of ``event_share``, which would otherwise count their children twice.
    container_events: tuple[str, ...] = ("async_rollout_with_monitoring_duration",)
    truncation_reasons: tuple[str, ...] = ("length", "max_tokens", "truncated")
    emit_batch_summaries: bool = True


@dataclass(slots=True)
class _Request:
    worker: str
    request_id: str
    start: float
    end: float
    events: int = 0
    aborted: bool = False
    padding_s: float = 0.0
    tokens: int = 0
    tokens_known: bool = False
    finish_reason: str | None = None
    unparseable: bool | None = None
    engine_by_turn: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Worker:
    events: int = 0
    busy_s: float = 0.0
    last_request_end: float | None = None
    last_other_end: float | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """Payloads (event fields without the envelope) of one step's derived events."""

    step: dict[str, Any]
    workers: tuple[dict[str, Any], ...]
    stragglers: tuple[dict[str, Any], ...]
    batch: dict[str, Any] | None
    last_ts: float


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of already sorted values (``q`` in [0, 1])."""
    n = len(sorted_values)
    return sorted_values[max(0, math.ceil(q * n - 1e-9) - 1)]


def quantiles(sorted_values: Sequence[float]) -> tuple[float, ...]:
    if not sorted_values:
        return ()
    last = QUANTILE_POINTS - 1
    return tuple(quantile(sorted_values, i / last) for i in range(QUANTILE_POINTS))


def _has(name: str, markers: tuple[str, ...]) -> bool:
    return any(m in name for m in markers)


#: What the fold keeps of one trace event: a flat tuple (cheap to hold and to scan):
#: (worker, request_id, turn, event_name, start, end, duration_s, completion_tokens,
#:  finish_reason, aborted, unparseable, policy_version)
Observation = tuple[
    str,
    str | None,
    int | None,
    str,
    float,
    float,
    float,
    int | None,
    str | None,
    bool,
    bool | None,
    int | None,
]


OBSERVATION_FIELDS = 12


def observe(ev: RolloutTraceRecorded) -> Observation:
    """The :data:`Observation` of one trace event."""
    d = ev.__dict__  # one dict read per field: this runs once per trace event
    end = d["ts"]
    dur = d["duration_s"]
    start = d["started_at"]
    return (
        d["worker"],
        d["request_id"],
        d["turn"],
        d["event_name"],
        end - dur if start is None else start,
        end,
        dur,
        d["completion_tokens"],
        d["finish_reason"],
        d["aborted"],
        d["unparseable"],
        d["policy_version"],
    )


def profile_step(observations: Sequence[Observation], cfg: ProfilingConfig) -> StepResult:
    """Every figure of one step from its observations (any order; at least one)."""
    requests: dict[tuple[str, str], _Request] = {}
    workers: dict[str, _Worker] = {}
    event_seconds: dict[str, float] = {}
    first_start = math.inf
    first_req_start = math.inf
    last_end = -math.inf
    policy_version: int | None = None
    classify: dict[str, tuple[bool, bool, bool, bool]] = {}
    for ob in observations:
        wname, rid, turn, name, start, end, dur, tokens, finish, aborted, unparse, pv = ob
        kind = classify.get(name)
        if kind is None:
            kind = classify[name] = (
                _has(name, cfg.engine_markers),
                _has(name, cfg.padding_markers),
                _has(name, cfg.barrier_markers),
                _has(name, cfg.abort_markers),
            )
        is_engine, is_padding, is_barrier, is_abort = kind
        if start < first_start:
            first_start = start
        if end > last_end:
            last_end = end
        event_seconds[name] = event_seconds.get(name, 0.0) + dur
        if pv is not None and (policy_version is None or pv > policy_version):
            policy_version = pv
        w = workers.get(wname)
        if w is None:
            w = workers[wname] = _Worker()
        w.events += 1
        w.busy_s += dur
        if rid is None:
            if not is_barrier and (w.last_other_end is None or end > w.last_other_end):
                w.last_other_end = end
            continue
        if start < first_req_start:
            first_req_start = start
        if w.last_request_end is None or end > w.last_request_end:
            w.last_request_end = end
        key = (wname, rid)
        r = requests.get(key)
        if r is None:
            r = requests[key] = _Request(wname, rid, start, end)
        else:
            if start < r.start:
                r.start = start
            if end > r.end:
                r.end = end
        r.events += 1
        if is_abort or aborted:
            r.aborted = True
        if is_padding:
            r.padding_s += dur
        if tokens is not None:
            r.tokens += tokens
            r.tokens_known = True
        if finish is not None:
            r.finish_reason = finish
        if unparse is not None:
            r.unparseable = bool(r.unparseable) or unparse
        if turn is not None:
            by_turn = r.engine_by_turn
            by_turn[turn] = by_turn.get(turn, 0.0) + (dur if is_engine else 0.0)

    origin = first_req_start if requests else first_start
    step = _step_figures(requests, workers, event_seconds, origin, cfg)
    step["trace_events"] = len(observations)
    step["step_span_s"] = last_end - first_start
    worker_rows, stragglers = _worker_figures(requests, workers, origin, step, cfg)
    batch = _batch_summary(requests, policy_version, cfg)
    return StepResult(step, tuple(worker_rows), tuple(stragglers), batch, last_end)


def _step_figures(
    requests: dict[tuple[str, str], _Request],
    workers: dict[str, _Worker],
    event_seconds: dict[str, float],
    origin: float,
    cfg: ProfilingConfig,
) -> dict[str, Any]:
    completed = [r for r in requests.values() if not r.aborted]
    aborted = [r for r in requests.values() if r.aborted]
    done = sorted(r.end - origin for r in completed)
    shared = {k: v for k, v in event_seconds.items() if k not in cfg.container_events}
    total_s = sum(shared.values())
    out: dict[str, Any] = {
        "workers": len(workers),
        "requests": len(requests),
        "completed_requests": len(completed),
        "aborted_requests": len(aborted),
        "aborted_share": len(aborted) / len(requests) if requests else 0.0,
        "aborted_cost_s": sum(r.end - r.start for r in aborted),
        "padding_s": sum(r.padding_s for r in requests.values()),
        "event_seconds": event_seconds,
        "event_share": {k: (v / total_s if total_s > 0 else 0.0) for k, v in shared.items()},
    }
    if done:
        rollout_s = done[-1]
        slowest = max(completed, key=lambda r: (r.end, r.worker, r.request_id))
        t80 = quantile(done, cfg.done_share)
        out.update(
            rollout_s=rollout_s,
            done_by_40pct=bisect_right(done, cfg.long_tail_at * rollout_s) / len(done),
            t80_s=t80,
            t80_frac=t80 / rollout_s if rollout_s > 0 else 1.0,
            p50_s=quantile(done, 0.5),
            p90_s=quantile(done, 0.9),
            p99_s=quantile(done, 0.99),
            slowest_request_id=slowest.request_id,
            slowest_request_worker=slowest.worker,
            slowest_request_s=rollout_s,
            completion_quantiles_s=quantiles(done),
        )
    hist: dict[int, int] = {}
    span_by_turns: dict[int, list[float]] = {}
    engine_by_turn: dict[int, list[float]] = {}
    for r in requests.values():
        if not r.engine_by_turn:
            continue
        n = len(r.engine_by_turn)
        hist[n] = hist.get(n, 0) + 1
        if not r.aborted:
            span_by_turns.setdefault(n, []).append(r.end - r.start)
        for turn, secs in r.engine_by_turn.items():
            engine_by_turn.setdefault(turn, []).append(secs)
    out["turn_histogram"] = {str(k): v for k, v in sorted(hist.items())}
    out["engine_s_by_turn"] = {str(k): sum(v) / len(v) for k, v in sorted(engine_by_turn.items())}
    out["request_s_by_turns"] = {str(k): sum(v) / len(v) for k, v in sorted(span_by_turns.items())}
    return out


def _worker_figures(
    requests: dict[tuple[str, str], _Request],
    workers: dict[str, _Worker],
    origin: float,
    step: dict[str, Any],
    cfg: ProfilingConfig,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    per_worker: dict[str, list[_Request]] = {w: [] for w in workers}
    for r in requests.values():
        per_worker[r.worker].append(r)
    completion: dict[str, float] = {}
    for name, w in workers.items():
        end = w.last_request_end if w.last_request_end is not None else w.last_other_end
        completion[name] = (end - origin) if end is not None else 0.0
    if not completion:
        return [], []
    slowest_s = max(completion.values())
    slowest_w = min(n for n, s in completion.items() if s == slowest_s)
    med = median(completion.values())
    waits = {n: slowest_s - s for n, s in completion.items()}
    step.update(
        slowest_worker=slowest_w,
        slowest_worker_s=slowest_s,
        median_worker_s=med,
        barrier_wait_total_s=sum(waits.values()),
        barrier_wait_mean_s=sum(waits.values()) / len(waits),
    )
    rows = []
    for name in sorted(workers, key=_natural):
        reqs = per_worker[name]
        done = sorted(r.end - origin for r in reqs if not r.aborted)
        rows.append(
            {
                "worker": name,
                "trace_events": workers[name].events,
                "requests": len(reqs),
                "completed_requests": len(done),
                "aborted_requests": len(reqs) - len(done),
                "completion_s": completion[name],
                "barrier_wait_s": waits[name],
                "busy_s": workers[name].busy_s,
                "completion_quantiles_s": quantiles(done),
            }
        )
    stragglers = []
    others = sorted(completion.values())
    second = others[-2] if len(others) >= 2 else slowest_s
    for name in sorted(completion, key=_natural):
        secs = completion[name]
        if len(completion) < 2 or secs <= cfg.straggler_k * med:
            continue
        if secs - med < cfg.straggler_min_gap_s:
            continue
        mine = [r for r in per_worker[name] if not r.aborted]
        slow_req = max(mine, key=lambda r: (r.end, r.request_id)) if mine else None
        imposed = (secs - second) * (len(completion) - 1) if secs == slowest_s else 0.0
        ratio = secs / med if med > 0 else math.inf
        stragglers.append(
            {
                "worker": name,
                "worker_s": secs,
                "median_worker_s": med,
                "ratio": ratio,
                "k": cfg.straggler_k,
                "barrier_wait_imposed_s": imposed,
                "slowest_request_id": slow_req.request_id if slow_req else None,
                "slowest_request_s": (slow_req.end - origin) if slow_req else None,
                "reason": (
                    f"worker {name} finished its rollout after {secs:.1f}s, {ratio:.1f}x the "
                    f"median worker ({med:.1f}s); the other workers waited at the barrier"
                ),
            }
        )
    step["straggler_workers"] = tuple(s["worker"] for s in stragglers)
    return rows, stragglers


def _batch_summary(
    requests: dict[tuple[str, str], _Request], policy_version: int | None, cfg: ProfilingConfig
) -> dict[str, Any] | None:
    """Rollout quality of the step's completed requests that reported token counts, with
    the newest policy version the step's traces name; ``None`` when no request reported
    tokens or no trace named a version (no figure is better than a made-up one)."""
    known = [r for r in requests.values() if not r.aborted and r.tokens_known]
    if not known or policy_version is None:
        return None
    n = len(known)
    return {
        "policy_version": policy_version,
        "num_sequences": n,
        "mean_length": sum(r.tokens for r in known) / n,
        "max_length": max(r.tokens for r in known),
        "truncation_rate": sum(r.finish_reason in cfg.truncation_reasons for r in known) / n,
        "unparseable_rate": sum(bool(r.unparseable) for r in known) / n,
        "tokens_generated": sum(r.tokens for r in known),
    }


def _natural(name: str) -> tuple[int, int | str]:
    """Sort ``"2"`` before ``"10"``; names that are not numbers after them."""
    return (0, int(name)) if name.isdigit() else (1, name)
