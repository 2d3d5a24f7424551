"""The silent-failure backtest (seed 000, Verification): what the catalog would have said.

:func:`backtest` folds one run's recorded events through :class:`RunHealthFold` (the
current catalog, or any other) and reports, per detector, the first alert it would have
fired: its step (the step of the event that fired it), window and reason. Against the
step at which the incident was actually noticed it says whether a *paging* alert came
first ("raises at least one page before the historical detection time"), and what the
run spent before the first page and between it and the incident (the money a pause at
the page would have saved), priced per pool from the accounting price list the caller
passes in.

Events are folded in the order given, as a live run's are: a step event at or below a
step already folded is late or repeated (a resumed run logs its steps again; a file
exported newest first holds nothing but) and the fold drops it. The report says so: the
steps the detectors saw (``first_step``/``last_step``) apart from the steps in the input
(``input_steps``), how many step events came below a step already folded (``late_steps``:
out of step order) or at it (``repeated_steps``: a second row for one step, as TRL's eval
and end-of-training rows are, which changes nothing), and how many events of any kind the
fold dropped (``late_events``).

Pure: events in, a frozen report out; no clock, no I/O (the CLI reads the files).
Escalations of an already firing alert are not first alerts and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from events.catalog.derived import AlertFired
from events.envelope import EventBase
from stream_processors.detectors.run_health import RunHealthFold


@dataclass(frozen=True, slots=True)
class FirstAlert:
    """A detector's first alert in the run."""

    detector: str
    layer: str
    routing: str
    step: int
    window_start: int
    window_end: int
    reason: str


@dataclass(frozen=True, slots=True)
class RunBacktest:
    run_id: str
    tenant_id: str
    #: the span of the trainer steps the detectors folded
    first_step: int | None
    last_step: int | None
    config_version: str
    alerts: tuple[FirstAlert, ...] = ()
    #: the span of the trainer steps in the input (folded or not)
    input_steps: tuple[int | None, int | None] = (None, None)
    #: trainer steps the fold dropped below the highest step folded before them (out of
    #: step order), at it (repeated), and events of any kind it dropped
    late_steps: int = 0
    late_events: int = 0
    repeated_steps: int = 0
    #: (step, price key, device-seconds) of every usage fact with a step, in log order; the
    #: key is the pool for GPU time (``UsageRecorded`` v3), "<kind>/<pool>" for other kinds
    usage: tuple[tuple[int, str, float], ...] = field(default=(), repr=False)

    @property
    def first_page(self) -> FirstAlert | None:
        pages = [a for a in self.alerts if a.routing == "page"]
        return min(pages, key=lambda a: a.step) if pages else None

    def spend_usd(self, prices: Mapping[str, float], after: int, upto: int) -> float:
        """USD of the usage at steps in ``(after, upto]``."""
        return sum(
            gpu * prices.get(pool, 0.0) for step, pool, gpu in self.usage if after < step <= upto
        )

    def verdict(self, incident_step: int | None) -> bool | None:
        """True when a page fired before ``incident_step``; None without one."""
        if incident_step is None:
            return None
        page = self.first_page
        return page is not None and page.step < incident_step

    def as_dict(
        self, incident_step: int | None = None, prices: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        page = self.first_page
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "tenant_id": self.tenant_id,
            "steps": [self.first_step, self.last_step],
            "steps_in_input": list(self.input_steps),
            "late": {
                "steps": self.late_steps,
                "repeated_steps": self.repeated_steps,
                "events": self.late_events,
            },
            "config_version": self.config_version,
            "detectors": [
                {
                    "detector": a.detector,
                    "layer": a.layer,
                    "routing": a.routing,
                    "fired_at_step": a.step,
                    "window": [a.window_start, a.window_end],
                    "lead_steps": None if incident_step is None else incident_step - a.step,
                    "reason": a.reason,
                }
                for a in self.alerts
            ],
            "first_page": None if page is None else {"detector": page.detector, "step": page.step},
            "incident_step": incident_step,
            "passed": self.verdict(incident_step),
        }
        if prices is not None and self.usage:  # (money was spent on every step, folded or not)
            first, last = self.input_steps
            start = (first or 0) - 1
            end = last if last is not None else 0
            page_at = page.step if page is not None else end
            out["spend_usd"] = {
                "run": self.spend_usd(prices, start, end),
                "before_first_page": self.spend_usd(prices, start, page_at),
                "first_page_to_incident": (
                    self.spend_usd(prices, page_at, incident_step)
                    if page is not None and incident_step is not None
                    else None
                ),
            }
        return out


def backtest(events: Iterable[EventBase], fold: RunHealthFold) -> dict[str, RunBacktest]:
    """Fold every run's events (in the order given) and report each run's first alerts."""
    states: dict[str, Any] = {}
    firsts: dict[str, dict[str, FirstAlert]] = {}
    tenants: dict[str, str] = {}
    spans: dict[str, tuple[int, int]] = {}  # steps folded
    inputs: dict[str, tuple[int, int]] = {}  # steps in the input
    late_steps: dict[str, int] = {}
    repeated: dict[str, int] = {}
    usage: dict[str, list[tuple[int, str, float]]] = {}
    for ev in events:
        run = ev.run_id
        state = states.get(run)
        if state is None:
            state = fold.initial()
            firsts[run], tenants[run], usage[run] = {}, ev.tenant_id, []
            late_steps[run] = repeated[run] = 0
        states[run], derived = fold.apply(state, ev)
        if ev.type == "TrainerStepCompleted" and ev.step is not None:
            inputs[run] = _widen(inputs.get(run), ev.step)
            if states[run].late > state.late:  # dropped: late or repeated
                if ev.step < state.marks[0]:
                    late_steps[run] += 1
                else:
                    repeated[run] += 1
            else:
                spans[run] = _widen(spans.get(run), ev.step)
        elif ev.type == "UsageRecorded" and ev.step is not None:
            kind, pool = ev.device_kind, ev.pool  # type: ignore[attr-defined]
            key = pool if kind == "gpu" else f"{kind}/{pool}"
            usage[run].append((ev.step, key, ev.device_seconds))  # type: ignore[attr-defined]
        for a in derived:
            if not isinstance(a, AlertFired) or a.escalated or a.detector in firsts[run]:
                continue
            step = a.step if a.step is not None else a.window_end
            firsts[run][a.detector] = FirstAlert(
                a.detector, a.layer, a.routing, step, a.window_start, a.window_end, a.reason
            )
    return {
        run: RunBacktest(
            run_id=run,
            tenant_id=tenants[run],
            first_step=spans.get(run, (None, None))[0],
            last_step=spans.get(run, (None, None))[1],
            config_version=fold.catalog.version,
            alerts=tuple(sorted(firsts[run].values(), key=lambda a: (a.step, a.detector))),
            usage=tuple(usage[run]),
            input_steps=inputs.get(run, (None, None)),
            late_steps=late_steps[run],
            late_events=states[run].late,
            repeated_steps=repeated[run],
        )
        for run in states
    }


def _widen(span: tuple[int, int] | None, step: int) -> tuple[int, int]:
    return (step, step) if span is None else (min(span[0], step), max(span[1], step))
