"""A run's rollout profile across steps, gathered from the fold's derived events (pure).

:func:`build_report` takes what :class:`~stream_processors.profiling.ProfilingFold`
emitted for one run (``StepProfiled``, ``WorkerProfiled``, ``StragglerDetected``,
``RolloutBatchCompleted``) and arranges it for tables, JSON and plots. The only
aggregates it adds are across steps:

- ``event_share_avg``: per event name, the mean over steps of its per-step share (a
  step without the event counts 0) - the seed's "Avg % of Total Time" table;
- ``turn_histogram``: requests per turn count, summed over steps;
- ``engine_s_by_turn`` / ``request_s_by_turns``: means over the steps that have them;
- ``focus_step``: the step the per-worker view shows by default - the one with the most
  barrier wait (where the slowest worker cost the others most).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from events.catalog.profile import StepProfiled, StragglerDetected, WorkerProfiled
from events.catalog.rollout import RolloutBatchCompleted
from events.envelope import EventBase


@dataclass
class ProfileReport:
    run_id: str
    steps: list[StepProfiled] = field(default_factory=list)
    workers: dict[int, list[WorkerProfiled]] = field(default_factory=dict)
    stragglers: list[StragglerDetected] = field(default_factory=list)
    batches: list[RolloutBatchCompleted] = field(default_factory=list)
    event_share_avg: dict[str, float] = field(default_factory=dict)
    turn_histogram: dict[int, int] = field(default_factory=dict)
    engine_s_by_turn: dict[int, float] = field(default_factory=dict)
    request_s_by_turns: dict[int, float] = field(default_factory=dict)
    focus_step: int | None = None

    def as_json(self) -> dict[str, Any]:
        def dump(ev: EventBase) -> dict[str, Any]:
            return ev.model_dump(mode="json", exclude={"tenant_id", "run_id", "producer", "seq"})

        return {
            "run_id": self.run_id,
            "steps": [dump(s) for s in self.steps],
            "workers": {str(k): [dump(w) for w in v] for k, v in sorted(self.workers.items())},
            "stragglers": [dump(s) for s in self.stragglers],
            "rollout_batches": [dump(b) for b in self.batches],
            "event_share_avg": self.event_share_avg,
            "turn_histogram": {str(k): v for k, v in self.turn_histogram.items()},
            "engine_s_by_turn": {str(k): v for k, v in self.engine_s_by_turn.items()},
            "request_s_by_turns": {str(k): v for k, v in self.request_s_by_turns.items()},
            "focus_step": self.focus_step,
        }


def _mean_by_int_key(maps: list[dict[str, Any]]) -> dict[int, float]:
    acc: dict[int, list[float]] = {}
    for m in maps:
        for k, v in m.items():
            acc.setdefault(int(k), []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(acc.items())}


def build_report(run_id: str, derived: Iterable[EventBase]) -> ProfileReport:
    """The report of ``run_id`` from the fold's output (other runs' events are ignored;
    a repeated event - same id - counts once)."""
    rep = ProfileReport(run_id)
    seen: set[Any] = set()
    for ev in derived:
        if ev.run_id != run_id or ev.event_id in seen:
            continue
        seen.add(ev.event_id)
        if isinstance(ev, StepProfiled):
            rep.steps.append(ev)
        elif isinstance(ev, WorkerProfiled) and ev.step is not None:
            rep.workers.setdefault(ev.step, []).append(ev)
        elif isinstance(ev, StragglerDetected):
            rep.stragglers.append(ev)
        elif isinstance(ev, RolloutBatchCompleted):
            rep.batches.append(ev)
    rep.steps.sort(key=lambda s: s.step or 0)
    rep.stragglers.sort(key=lambda s: (s.step or 0, s.worker))
    rep.batches.sort(key=lambda b: b.step or 0)
    if not rep.steps:
        return rep
    names: set[str] = set()
    for s in rep.steps:
        names.update(k for k, _ in s.event_share)
    totals = dict.fromkeys(names, 0.0)
    for s in rep.steps:
        for k, v in s.event_share:
            totals[k] += float(v or 0.0)
    n = len(rep.steps)
    rep.event_share_avg = dict(
        sorted(((k, v / n) for k, v in totals.items()), key=lambda kv: (-kv[1], kv[0]))
    )
    for s in rep.steps:
        for k, v in s.turn_histogram:
            rep.turn_histogram[int(k)] = rep.turn_histogram.get(int(k), 0) + int(v or 0)
    rep.turn_histogram = dict(sorted(rep.turn_histogram.items()))
    rep.engine_s_by_turn = _mean_by_int_key([dict(s.engine_s_by_turn) for s in rep.steps])
    rep.request_s_by_turns = _mean_by_int_key([dict(s.request_s_by_turns) for s in rep.steps])
    focus = max(rep.steps, key=lambda s: (s.barrier_wait_total_s, -(s.step or 0)))
    rep.focus_step = focus.step
    return rep
