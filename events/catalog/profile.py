"""Facts derived from rollout traces by the profiling processor (seed 003).

All three are emitted once per finalized step by ``stream_processors.profiling``; their
ids are deterministic (run, step, kind, worker), ``ts`` is the end of the step's last
trace event, and times are seconds relative to the step's *origin*: the start of its
earliest request-scoped trace event (its earliest trace event when no event names a
request). Quantile tuples hold ``QUANTILE_POINTS`` values: the completion time by which
``0 %, 1 %, …, 100 %`` of the completed requests were done (empty when none completed).

Attribute maps use string keys (``"2"`` for two turns); consumers ``int()`` them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase, Int

#: Length of every ``*_quantiles_s`` tuple: 0 %, 1 %, …, 100 %.
QUANTILE_POINTS = 101


class _Profile(EventBase):
    TOPIC: ClassVar[str] = "runwatch.profiles"


class StepProfiled(_Profile):
    """The rollout profile of one step: long tail, barrier, event shares, turns, aborts.

    - ``rollout_s``: origin to the last completed request; ``done_by_40pct``: share of
      completed requests done by 40 % of ``rollout_s``; ``t80_s``: time by which 80 % were
      done (``t80_frac`` = ``t80_s / rollout_s``).
    - workers: ``slowest_worker_s`` / ``median_worker_s`` are worker completion times (last
      request-scoped event end); ``barrier_wait_total_s`` is what the slowest worker
      imposes on the others: the sum over workers of ``slowest - own``.
    - ``event_seconds`` / ``event_share``: summed ``duration_s`` per event name and its
      share of the step's summed durations; enclosing events (a worker's whole rollout)
      appear in seconds but not in shares, so the shares of leaf events sum to 1.
    - turns: ``turn_histogram`` (#turns -> requests), ``engine_s_by_turn`` (turn index ->
      mean engine seconds in that turn), ``request_s_by_turns`` (#turns -> mean request
      span).
    - aborted (over-sampled) requests: count, share of all requests, and ``aborted_cost_s``
      the request-seconds they held (their spans, padding included).
    - ``slow_step``: ``step_span_s`` beyond ``k x`` the median of recent steps.
    """

    type: Literal["StepProfiled"] = "StepProfiled"
    trace_events: Int
    workers: Int
    requests: Int
    completed_requests: Int
    aborted_requests: Int = 0
    aborted_share: float = 0.0
    aborted_cost_s: float = 0.0
    padding_s: float = 0.0
    step_span_s: float
    rollout_s: float | None = None
    done_by_40pct: float | None = None
    t80_s: float | None = None
    t80_frac: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    slowest_request_id: str | None = None
    slowest_request_worker: str | None = None
    slowest_request_s: float | None = None
    completion_quantiles_s: tuple[float, ...] = ()
    slowest_worker: str | None = None
    slowest_worker_s: float | None = None
    median_worker_s: float | None = None
    barrier_wait_total_s: float = 0.0
    barrier_wait_mean_s: float = 0.0
    straggler_workers: tuple[str, ...] = ()
    event_seconds: Attributes = ()
    event_share: Attributes = ()
    turn_histogram: Attributes = ()
    engine_s_by_turn: Attributes = ()
    request_s_by_turns: Attributes = ()
    slow_step: bool = False
    median_step_s: float | None = None
    late_events: Int = 0


class WorkerProfiled(_Profile):
    """One rollout worker within one step: when it finished, what it waited at the
    barrier (``slowest worker - own``), and its own request-completion quantiles."""

    type: Literal["WorkerProfiled"] = "WorkerProfiled"
    worker: str
    trace_events: Int
    requests: Int
    completed_requests: Int
    aborted_requests: Int = 0
    completion_s: float
    barrier_wait_s: float = 0.0
    busy_s: float = 0.0
    completion_quantiles_s: tuple[float, ...] = ()


class StragglerDetected(_Profile):
    """A worker finished beyond ``k x`` the median worker of its step (and at least
    ``min_gap_s`` later): every other worker waited for it at the barrier.
    ``barrier_wait_imposed_s`` is the wait it alone caused (its completion minus the
    second-slowest worker's, times the other workers)."""

    type: Literal["StragglerDetected"] = "StragglerDetected"
    worker: str
    worker_s: float
    median_worker_s: float
    ratio: float
    k: float
    barrier_wait_imposed_s: float
    slowest_request_id: str | None = None
    slowest_request_s: float | None = None
    reason: str
