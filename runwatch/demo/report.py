"""The demo's end: the table of runs, detection lags, and a report with charts on disk.

Everything here is read from the log and the projections' views: the table is what the
customer and the operator would see, not what the demo intended.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events import (
    AlertFired,
    EvalGateScored,
    EventBase,
    TenantUsageUpdated,
    TrainerStepCompleted,
)
from events.log.embedded import EmbeddedLog
from projections.views import RunView
from runwatch.demo.orchestrate import RunOutcome
from runwatch.demo.scenarios import Scenario


@dataclass
class RunRow:
    run_id: str
    tenant_id: str
    title: str
    state: str
    reason: str
    failure_class: str | None
    alerts: list[str]
    first_alert_step: dict[str, int]
    spend_usd: float
    expected_ok: bool
    problems: list[str] = field(default_factory=list)
    resume: str = ""
    #: the pauses the trainer confirmed (step, reason) and what the tenant did then
    pauses: list[tuple[int, str]] = field(default_factory=list)
    tenant_actions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def rows(
    scenarios: list[Scenario], outcomes: list[RunOutcome], views: dict[str, RunView],
    derived: list[EventBase],
) -> list[RunRow]:  # fmt: skip
    """One row per scenario, with whether the plane did what the scenario expects."""
    fired: dict[str, dict[str, int]] = defaultdict(dict)
    for ev in derived:
        if isinstance(ev, AlertFired):
            fired[ev.run_id].setdefault(ev.detector, ev.window_end)
    by_run = {o.scenario.run_id: o for o in outcomes}
    out = []
    for s in scenarios:
        view = _view(views, s.run_id)
        state = (view.state if view else None) or "UNKNOWN"
        alerts = sorted(fired.get(s.run_id, {}))
        problems = []
        if s.expect_states and state not in s.expect_states:
            problems.append(f"state {state}, expected {'/'.join(s.expect_states)}")
        for a in s.expect_alerts:
            if a not in alerts:
                problems.append(f"alert {a} did not fire")
        if s.expect_failure_class and (
            view is None or view.failure_class != s.expect_failure_class
        ):
            got = view.failure_class if view else None
            problems.append(f"failure class {got}, expected {s.expect_failure_class}")
        outcome = by_run.get(s.run_id)
        if s.expect_paused and not (outcome and outcome.pauses):
            problems.append("the run was never paused")
        if s.kind != "train" and not (
            outcome and outcome.resume and outcome.resume.get("certified")
        ):
            problems.append("no certified resume (was the run killed before it completed?)")
        reason, failure_class = (view.reason, view.failure_class) if view else ("", None)
        out.append(
            RunRow(
                run_id=s.run_id, tenant_id=s.tenant_id, title=s.title, state=state,
                reason=reason, failure_class=failure_class,
                alerts=alerts, first_alert_step=dict(fired.get(s.run_id, {})),
                spend_usd=view.spend() if view else 0.0, expected_ok=not problems,
                problems=problems, resume=_resume_text(outcome),
                pauses=list(outcome.pauses) if outcome else [],
                tenant_actions=list(outcome.tenant_actions) if outcome else [],
            )
        )  # fmt: skip
    return out


def _view(views: dict[str, RunView], run_id: str) -> RunView | None:
    for key, view in views.items():
        if view.run_id == run_id or key == run_id:
            return view
    return None


def _resume_text(outcome: RunOutcome | None) -> str:
    if outcome is None or outcome.resume is None:
        return ""
    r = outcome.resume
    rejected = [
        f"{x['checkpoint'].rsplit('/', 1)[-1]}: {x['reason']}" for x in r.get("rejections", [])
    ]
    cert = "certified" if r.get("certified") else "not certified"
    where = str(r.get("checkpoint") or "").rsplit("/", 1)[-1]
    text = f"killed at step {outcome.killed_at_step}; {cert} from {where}"
    if rejected:
        text += f" after rejecting {', '.join(rejected)}"
    return text


def series(log_dir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Per run: reward, KL, eval-gate and spend series (step, value) from the log."""
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    out: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for ev in log.iter_events(["runwatch.telemetry", "runwatch.tenant-usage"]):
        if not isinstance(ev, EventBase) or ev.step is None:
            continue
        s = out[ev.run_id]
        if isinstance(ev, TrainerStepCompleted):
            if ev.reward_mean is not None:
                s["reward"].append((ev.step, ev.reward_mean))
            if ev.kl_to_ref is not None:
                s["kl"].append((ev.step, ev.kl_to_ref))
            if ev.entropy is not None:
                s["entropy"].append((ev.step, ev.entropy))
        elif isinstance(ev, EvalGateScored):
            s["eval_gate"].append((ev.step, ev.score))
        elif isinstance(ev, TenantUsageUpdated):
            s["spend_usd"].append((ev.step, ev.spend_usd))
    return out


def write_report(
    out_dir: Path, table: list[RunRow], log_dir: Path, summary: dict[str, Any]
) -> Path:
    """``report.html`` plus one PNG of charts per run; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    data = series(log_dir)
    sections = []
    for row in table:
        runs = data.get(row.run_id, {})
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.2))
        for ax, (key, label) in zip(
            axes,
            [("reward", "reward mean"), ("kl", "KL to reference"),
             ("eval_gate", "eval-gate score"), ("spend_usd", "spend so far (USD)")],
        ):  # fmt: skip
            pts = runs.get(key, [])
            if pts:
                xs, ys = zip(*sorted(pts))
                ax.plot(xs, [y if math.isfinite(y) else float("nan") for y in ys],
                        marker="." if key == "eval_gate" else None)  # fmt: skip
            for det, step in row.first_alert_step.items():
                ax.axvline(step, color="tab:red", linestyle="--", linewidth=0.8)
                if key == "reward":
                    ax.annotate(det, (step, 0.98), xycoords=("data", "axes fraction"),
                                rotation=90, fontsize=7, va="top", color="tab:red")  # fmt: skip
            ax.set_title(label, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
        fig.suptitle(f"{row.run_id} ({row.tenant_id}): {row.state}", fontsize=10)
        fig.tight_layout()
        png = out_dir / f"{row.run_id}.png"
        fig.savefig(png, dpi=90)
        plt.close(fig)
        fired = ", ".join(f"{a} @ step {n}" for a, n in row.first_alert_step.items())
        resumed = "; " + row.resume if row.resume else ""
        sections.append(
            f"<h2>{html.escape(row.run_id)} <small>{html.escape(row.tenant_id)} — "
            f"{html.escape(row.title)}</small></h2>"
            f"<p><b>{html.escape(row.state)}</b>"
            f"{' (' + html.escape(row.failure_class) + ')' if row.failure_class else ''}: "
            f"{html.escape(row.reason)}</p>"
            f"<p>alerts: {html.escape(fired or 'none')}{html.escape(resumed)}; "
            f"spend {_usd(row.spend_usd)}</p>"
            f'<img src="{png.name}" width="100%">'
        )  # fmt: skip
    table_html = "".join(
        f"<tr><td>{html.escape(r.tenant_id)}</td><td>{html.escape(r.run_id)}</td>"
        f"<td>{html.escape(r.state)}</td><td>{html.escape(r.failure_class or '')}</td>"
        f"<td>{html.escape(r.reason)}</td><td>{html.escape(', '.join(r.alerts))}</td>"
        f"<td>{_usd(r.spend_usd)}</td>"
        f"<td>{'ok' if r.expected_ok else html.escape('; '.join(r.problems))}</td></tr>"
        for r in table
    )  # fmt: skip
    facts = "".join(f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in summary.items())
    doc = f"""<!doctype html><meta charset="utf-8"><title>runwatch demo report</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}
small{{color:#666;font-weight:normal}}</style>
<h1>runwatch demo report</h1><ul>{facts}</ul>
<table><tr><th>tenant</th><th>run</th><th>state</th><th>failure class</th><th>reason</th>
<th>alerts</th><th>spend</th><th>as expected</th></tr>{table_html}</table>
{"".join(sections)}
"""
    path = out_dir / "report.html"
    path.write_text(doc)
    return path


def _usd(x: float) -> str:
    """Dollars, with the digits a CPU run's fractions of a cent need."""
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"
