"""Generate the provisioned Grafana dashboard ``dashboards/runwatch-overview.json``.

    python deploy/grafana/dashboard.py          # rewrite the JSON
    python deploy/grafana/dashboard.py --check  # exit 1 if the JSON is out of date

One row per layer of seed 000 step 1, in its order, then per-tenant accounting (step 4):

1. Infra: the platform SLIs this plane can attribute (job success, infra-failure share
   from the failure classes, queue depth) and the health of the pipeline itself.
2. Run mechanics: the step-time decomposition (rollout / score / sync / optim / idle),
   trainer idle fraction, reward-scoring failures by cause, mechanics alerts.
3. Algorithmic health: runs by customer state, algorithmic alerts by detector, state
   transitions. Per-run curves are not here: ``run_id`` never labels a Prometheus series
   (step 6); they are in the query API and the customer dashboard.
4. Tenant accounting: spend, GPU time by pool, tokens, cost per committed step, by the
   exporter's bounded ``tenant`` label.

Every expression uses only the series ``projections/exporter.py`` exposes and the
recording rules of ``deploy/prometheus/*-rules.yml``; tests/unit/test_deploy_stack.py
checks both against a real scrape.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "runwatch-overview.json"
DS = {"type": "prometheus", "uid": "runwatch-prometheus"}
T = 'tenant=~"$tenant"'


class Layout:
    """Grafana's 24-column grid: panels flow left to right, rows start a new line."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        if self.x:
            self.y += self.row_h
        self.x, self.row_h = 0, 0
        self.panels.append(
            {
                "type": "row",
                "id": self._id(),
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_h
            self.row_h = 0
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend}
    if instant:
        t.update(instant=True, range=False, format="table")
    return t


def stat(
    title: str, expr: str, unit: str = "short", desc: str = "", thresholds: list | None = None
) -> dict[str, Any]:
    steps = thresholds or [{"color": "text", "value": None}]
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr)],
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "decimals": 2 if unit in ("percentunit", "currencyUSD") else None,
                "thresholds": {"mode": "absolute", "steps": steps},
                "color": {"mode": "thresholds"},
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    }


def series(
    title: str,
    targets: list[dict[str, Any]],
    unit: str = "short",
    desc: str = "",
    stack: bool = False,
    bars: bool = False,
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {
                    "drawStyle": "bars" if bars else "line",
                    "lineWidth": 1,
                    "fillOpacity": 60 if bars else (25 if stack else 8),
                    "showPoints": "never",
                    "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                    "spanNulls": True,
                },
                "color": {"mode": "palette-classic"},
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def text(title: str, content: str) -> dict[str, Any]:
    return {"type": "text", "title": title, "options": {"mode": "markdown", "content": content}}


def table(title: str, targets: list[dict[str, Any]], desc: str = "") -> dict[str, Any]:
    units = {"Spend": "currencyUSD", "GPU hours": "short", "Cost per step": "currencyUSD"}
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "renameByName": {f"Value #{t['refId']}": t["legendFormat"] for t in targets},
                },
            },
        ],
        "fieldConfig": {
            "defaults": {"decimals": 2},
            "overrides": [
                {
                    "matcher": {"id": "byName", "options": name},
                    "properties": [{"id": "unit", "value": unit}],
                }
                for name, unit in units.items()
            ],
        },
        "options": {"showHeader": True, "sortBy": [{"displayName": "Spend", "desc": True}]},
    }


def build() -> dict[str, Any]:
    g = Layout()
    green_red = [{"color": "green", "value": None}, {"color": "red", "value": 1}]

    # -- 1. infra ----------------------------------------------------------------------
    g.row("Infra: platform SLIs and the plane's own health")
    g.add(
        stat(
            "Job success (1h)",
            'sum(rate(runwatch_runs_terminal_total{state="SUCCEEDED"}[1h]))'
            " / clamp_min(sum(rate(runwatch_runs_terminal_total[1h])), 1e-9)",
            "percentunit",
            "Share of runs ending in SUCCEEDED among every terminal run.",
        ),
        4,
        5,
    )
    g.add(
        stat(
            "Infra-failure share (1h)",
            # 0, not "no data", when runs ended but none of this class
            "runwatch:runs_platform_fault:ratio_rate1h or 0 * runwatch:runs_terminal:rate1h",
            "percentunit",
            "Terminal runs attributed to a platform fault (spends the platform error budget).",
            [{"color": "green", "value": None}, {"color": "red", "value": 0.05}],
        ),
        4,
        5,
    )
    g.add(
        stat(
            "Tenant-code failure share (1h)",
            # 0, not "no data", when runs ended but none of this class
            "runwatch:runs_tenant_code_fault:ratio_rate1h or 0 * runwatch:runs_terminal:rate1h",
            "percentunit",
            "Terminal runs attributed to the tenant's reward function or data (not ours).",
        ),
        4,
        5,
    )
    g.add(
        stat(
            "Waiting for capacity",
            'sum(runwatch_runs{state=~"QUEUED|PROVISIONING"})',
            desc="Runs queued or provisioning now.",
        ),
        4,
        5,
    )
    g.add(
        stat(
            "Projection lag",
            "time() - max(runwatch_projection_last_event_timestamp_seconds)",
            "s",
            "Seconds since the newest fact the projection folded (producer clock).",
            [{"color": "green", "value": None}, {"color": "red", "value": 300}],
        ),
        4,
        5,
    )
    g.add(
        stat(
            "Exporter up",
            'min(up{job="runwatch-projections"})',
            desc="1 when Prometheus scrapes the projections' exporter.",
            thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
        ),
        4,
        5,
    )
    g.add(
        series(
            "Live runs gone silent",
            [
                target(f"sum by (tenant) (runwatch_runs_silent{{{T}}})", "{{tenant}}"),
                target(
                    f"max by (tenant) (runwatch_runs_silent_max_age_seconds{{{T}}})",
                    "{{tenant}} oldest (s)",
                    "B",
                ),
            ],
            desc="RUNNING/DEGRADED runs whose newest fact is over 10 minutes old (the gates "
            "cannot act on them), and the oldest such age; RunwatchRunsSilent pages.",
        ),
        6,
        8,
    )
    g.add(
        series(
            "Longest gate pause",
            [
                target(
                    f"max by (tenant) (runwatch_runs_paused_max_age_seconds{{{T}}})",
                    "{{tenant}}",
                )
            ],
            "s",
            "How long each tenant's longest PAUSED_BY_GATE run has waited for an answer "
            "(it holds its allocation meanwhile); RunwatchRunPausedLong tickets after 4h.",
        ),
        6,
        8,
    )
    g.add(
        series(
            "Terminal runs by failure class",
            [
                target(
                    "sum by (state, failure_class) (increase(runwatch_runs_terminal_total[1h]))",
                    "{{state}} / {{failure_class}}",
                )
            ],
            desc="Every terminal run carries exactly one class (seed 000 step 4).",
            bars=True,
        ),
        12,
        8,
    )
    g.add(
        series(
            "Facts folded per second, by topic",
            [
                target(
                    "sum by (topic) (rate(runwatch_projection_events_total[$__rate_interval]))",
                    "{{topic}}",
                )
            ],
            "ops",
        ),
        6,
        8,
    )
    g.add(
        series(
            "Pipeline errors (1h)",
            [
                target("sum(increase(runwatch_projection_dead_letters_total[1h]))", "dead letters"),
                target(
                    "sum(increase(runwatch_run_state_transitions_rejected_total[1h]))",
                    "rejected transitions",
                    "B",
                ),
                target(
                    "sum(increase(runwatch_exporter_scrape_errors_total[1h]))",
                    "exporter read errors",
                    "C",
                ),
                target(
                    "sum(increase(runwatch_run_state_corrections_total[1h]))",
                    "state corrections (late facts)",
                    "D",
                ),
                target(
                    "sum(increase(runwatch_run_state_late_after_terminal_total[1h]))",
                    "facts after a run ended",
                    "E",
                ),
            ],
        ),
        6,
        8,
    )

    # -- 2. run mechanics -----------------------------------------------------------------
    g.row("Run mechanics: step-time breakdown, idle, reward scoring")
    g.add(
        series(
            "Share of step time by phase",
            [target("runwatch:step_phase_seconds:share_5m", "{{phase}}")],
            "percentunit",
            "rollout / score / sync / optim / idle / other: they sum to the step's wall clock.",
            stack=True,
        ),
        12,
        8,
    )
    g.add(
        series(
            "Step phase p95",
            [target("runwatch:step_phase_seconds:p95_5m", "{{phase}}")],
            "s",
        ),
        12,
        8,
    )
    g.add(
        stat(
            "Trainer idle fraction",
            'runwatch:step_phase_seconds:share_5m{phase="idle"}',
            "percentunit",
            "Trainer time waiting on the rollout fleet.",
            [{"color": "green", "value": None}, {"color": "orange", "value": 0.3}],
        ),
        4,
        8,
    )
    g.add(
        series(
            "Mean phase seconds per step",
            [
                target(
                    "sum by (phase) (rate(runwatch_step_phase_seconds_sum[$__rate_interval]))"
                    " / sum by (phase) (rate(runwatch_step_phase_seconds_count[$__rate_interval]))",
                    "{{phase}}",
                )
            ],
            "s",
        ),
        10,
        8,
    )
    g.add(
        series(
            "Active run-mechanics alerts",
            [
                target(
                    'sum by (detector) (runwatch_alerts_active{layer="run_mechanics"})',
                    "{{detector}}",
                )
            ],
            desc="Weight-sync staleness, trainer idle, checkpoint cadence: never customer-facing.",
        ),
        10,
        8,
    )
    g.add(
        series(
            "Reward samples scored per second, by outcome",
            [
                target(
                    "sum by (cause) (rate(runwatch_reward_samples_total[$__rate_interval]))",
                    "{{cause}}",
                )
            ],
            "ops",
            "ok, or the ledger cause of the failure (seed 002's per-cause ledger).",
            stack=True,
        ),
        12,
        8,
    )
    g.add(
        series(
            "Reward-scoring failures by cause",
            [target("runwatch:reward_samples_failed:ratio_rate15m", "{{cause}}")],
            "percentunit",
            "Share of reward samples that failed: tenant_* is the tenant's code, "
            "platform_error is ours.",
        ),
        12,
        8,
    )

    # -- 3. algorithmic health --------------------------------------------------------------
    g.row("Algorithmic health: run states and the alert catalog")
    g.add(
        stat(
            "Degraded runs",
            'sum(runwatch_runs{state="DEGRADED"})',
            thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
        ),
        4,
        5,
    )
    g.add(
        stat(
            "Paused by gate",
            'sum(runwatch_runs{state="PAUSED_BY_GATE"})',
            thresholds=[{"color": "green", "value": None}, {"color": "purple", "value": 1}],
        ),
        4,
        5,
    )
    g.add(stat("Running", 'sum(runwatch_runs{state="RUNNING"})'), 4, 5)
    g.add(
        stat(
            "Active algorithmic alerts",
            'sum(runwatch_alerts_active{layer="algorithmic"})',
            thresholds=green_red,
        ),
        4,
        5,
    )
    g.add(
        text(
            "Per-run curves",
            "Reward, KL, entropy and eval-gate curves are **per run**: they live in the query "
            "API (`/v1/runs/{id}/charts`, operator view) and the customer dashboard "
            "(`/dashboard`), not in Prometheus. `run_id` never labels a Prometheus series "
            "(seed 000 step 6).",
        ),
        8,
        5,
    )
    g.add(
        series(
            "Runs by customer-facing state",
            [target("sum by (state) (runwatch_runs)", "{{state}}")],
            stack=True,
        ),
        8,
        8,
    )
    g.add(
        series(
            "Active algorithmic alerts by detector",
            [
                target(
                    'sum by (detector) (runwatch_alerts_active{layer="algorithmic"})',
                    "{{detector}}",
                )
            ],
            desc="Unresolved alerts on live runs (reward hacking, KL blowup, dead run, ...).",
        ),
        8,
        8,
    )
    g.add(
        series(
            "Alerts fired per hour, by detector and routing",
            [
                target(
                    "sum by (detector, routing) "
                    '(increase(runwatch_alerts_fired_total{layer="algorithmic"}[1h]))',
                    "{{detector}} ({{routing}})",
                )
            ],
            bars=True,
        ),
        8,
        8,
    )
    g.add(
        series(
            "Run-state changes per hour, by target state",
            [
                target(
                    "sum by (to_state) (increase(runwatch_run_state_transitions_total[1h]))",
                    "{{to_state}}",
                )
            ],
            bars=True,
        ),
        24,
        7,
    )

    # -- 4. tenant accounting ----------------------------------------------------------------
    g.row("Tenant accounting (bounded tenant label: top tenants by spend + other)")
    g.add(
        stat(
            "Spend so far",
            f"sum(runwatch_tenant_spend_usd_total{{{T}}})",
            "currencyUSD",
            "List prices (stream_processors/accounting/prices.yaml).",
        ),
        6,
        5,
    )
    g.add(
        stat(
            "Spend per hour",
            f"sum(runwatch:tenant_spend_usd:rate1h{{{T}}})",
            "currencyUSD",
        ),
        6,
        5,
    )
    g.add(
        stat(
            "GPU hours",
            f"sum(runwatch_tenant_gpu_seconds_total{{{T}}}) / 3600",
            "short",
        ),
        6,
        5,
    )
    g.add(
        stat(
            "Cost per committed step",
            f"sum(runwatch_tenant_spend_usd_total{{{T}}})"
            f" / clamp_min(sum(runwatch_tenant_committed_steps_total{{{T}}}), 1)",
            "currencyUSD",
            "What a dead run costs per step that taught the model nothing.",
        ),
        6,
        5,
    )
    g.add(
        series(
            "Spend per hour by tenant",
            [target(f"runwatch:tenant_spend_usd:rate1h{{{T}}}", "{{tenant}}")],
            "currencyUSD",
            stack=True,
        ),
        12,
        8,
    )
    g.add(
        series(
            "GPUs busy by tenant and pool",
            [
                target(
                    "sum by (tenant, pool) "
                    f"(rate(runwatch_tenant_gpu_seconds_total{{{T}}}[$__rate_interval]))",
                    "{{tenant}} / {{pool}}",
                )
            ],
            desc="GPU-seconds per second: the rollout fleet vs the trainer pool.",
            stack=True,
        ),
        12,
        8,
    )
    g.add(
        series(
            "Devices billed by tenant and kind",
            [
                target(
                    "sum by (tenant, kind) "
                    f"(rate(runwatch_tenant_device_seconds_total{{{T}}}[$__rate_interval]))",
                    "{{tenant}} / {{kind}}",
                )
            ],
            desc="Device-seconds billed per second, every device kind (cpu where a run "
            "had no GPU): what the spend is priced on.",
            stack=True,
        ),
        12,
        8,
    )
    g.add(
        series(
            "Tokens per second by tenant",
            [
                target(
                    "sum by (tenant, kind) "
                    f"(rate(runwatch_tenant_tokens_total{{{T}}}[$__rate_interval]))",
                    "{{tenant}} {{kind}}",
                )
            ],
            "short",
        ),
        12,
        8,
    )
    g.add(
        table(
            "Tenants",
            [
                target(f"sum by (tenant) (runwatch_tenant_runs{{{T}}})", "Runs", "A", True),
                target(
                    f"sum by (tenant) (runwatch_tenant_spend_usd_total{{{T}}})",
                    "Spend",
                    "B",
                    True,
                ),
                target(
                    f"sum by (tenant) (runwatch_tenant_gpu_seconds_total{{{T}}}) / 3600",
                    "GPU hours",
                    "C",
                    True,
                ),
                target(
                    f"sum by (tenant) (runwatch_tenant_committed_steps_total{{{T}}})",
                    "Committed steps",
                    "D",
                    True,
                ),
                target(
                    f"sum by (tenant) (runwatch_tenant_spend_usd_total{{{T}}})"
                    f" / clamp_min(sum by (tenant) (runwatch_tenant_committed_steps_total{{{T}}}),"
                    " 1)",
                    "Cost per step",
                    "E",
                    True,
                ),
            ],
        ),
        12,
        8,
    )

    return {
        "uid": "runwatch-overview",
        "title": "runwatch / Overview",
        "description": "The three layers of seed 000 (infra, run mechanics, algorithmic "
        "health) and per-tenant accounting, from the runwatch projections exporter.",
        "tags": ["runwatch", "rl", "observability"],
        "editable": False,
        "graphTooltip": 1,
        "timezone": "utc",
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "type": "query",
                    "name": "tenant",
                    "label": "Tenant",
                    "datasource": DS,
                    "query": {
                        "query": "label_values(runwatch_tenant_runs, tenant)",
                        "refId": "tenant",
                    },
                    "definition": "label_values(runwatch_tenant_runs, tenant)",
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "sort": 1,
                }
            ]
        },
        "annotations": {"list": []},
        "links": [],
        "panels": g.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    text_ = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text_:
            print(f"{OUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text_)
    print(f"wrote {OUT} ({len(build()['panels'])} panels)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
