"""Gates that act: time from a paging alert to the trainer's ``RunPaused``, and the spend
accrued after the alert — with the run controller, beside the same runs without it.

Each round trains the three paging canary faults (constant reward -> ``dead_run``,
oversized LR -> ``kl_blowup``, gameable reward -> ``kl_blowup`` / ``reward_hacking``) as
real ``runwatch train`` processes, with the processors following the log while they
train:

- ``controller``: the run controller pauses the run on its first paging alert; the tenant
  (the demo orchestrator, through the command path the API uses) cancels it once paused;
- ``anchor (no controller)``: the same runs with ``--no-control``: the alert informs,
  the run trains to its end (what happened before the gates acted).

Figures per backend (embedded log; ``--kafka``: the Kafka plane — trainer spool, shipper,
faust worker, and the controller's commands shipped back): alert -> pause in steps and in
seconds (p50 / p99 / max over every paged run; ``ts`` of the alert is the step event it
fired on, ``ts`` of the pause is the trainer's answer), and device-seconds and USD billed
after the alert's step (``prices.yaml``), with the ratio controller / anchor.

Steps here are toy steps (~0.05-0.3 s on these CPUs), so the seconds are the figure that
carries over; on a real run (a step is seconds to minutes) the same latency is < 1 step.

Usage: ``python benchmarks/gate_latency.py [--rounds 2] [--kafka] [--json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from events import AlertFired, EventBase, PauseRequested, RunPaused, UsageRecorded
from events.log.embedded import EmbeddedLog
from runwatch.demo.canary import canaries
from runwatch.demo.orchestrate import Orchestrator
from stream_processors.accounting import Prices


def _facts(log_dir: Path) -> dict[str, list[EventBase]]:
    reader = EmbeddedLog(log_dir, readonly=True)
    reader.open_sync()
    out: dict[str, list[EventBase]] = {}
    for ev in reader.iter_events(reader.topic_names()):
        if isinstance(ev, EventBase):
            out.setdefault(ev.run_id, []).append(ev)
    return out


def measure_run(facts: list[EventBase], alerts: list[AlertFired], prices: Prices) -> dict[str, Any]:
    """One run: its first paging alert, the pause that answered it, what was billed after."""
    pages = [a for a in alerts if a.routing == "page"]
    if not pages:
        return {"paged": False}
    alert = min(pages, key=lambda a: a.ts)
    alert_step = alert.step if alert.step is not None else alert.window_end
    request = next(
        (e for e in facts if isinstance(e, PauseRequested) and e.alert_id == alert.alert_id), None
    )
    paused = next(
        (
            e
            for e in facts
            if isinstance(e, RunPaused) and request and e.request_id == str(request.event_id)
        ),
        None,
    )
    after = [e for e in facts if isinstance(e, UsageRecorded) and (e.step or 0) > alert_step]
    secs = sum(e.device_seconds for e in after)
    usd = sum(e.device_seconds * prices.device_price(e.device_kind, e.pool) for e in after)
    out: dict[str, Any] = {"paged": True, "billed_after_s": secs, "usd_after": usd}
    if paused is not None:
        out["lag_steps"] = (paused.step or 0) - alert_step
        out["lag_s"] = paused.ts - alert.ts
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_mode(backend: str, control: bool, rounds: int, bootstrap: str | None) -> dict[str, Any]:
    prices = Prices.load()
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="rw-gates-") as tmp:
            out = Path(tmp)
            log = out / "log"
            chosen = [c for c in canaries(f"bench{r}") if c.must_pause]
            # the tenant cancels at the first pause: what is billed after the first page
            scenarios = [replace(c.scenario, on_pause=("cancel",)) for c in chosen]
            if backend == "kafka":
                from runwatch.demo.kafka_plane import KafkaPlane

                tag = f"{int(time.time() * 1000) % 10**8}"
                scenarios = [replace(s, run_id=f"{s.run_id}-{tag}") for s in scenarios]
                plane: Any = KafkaPlane(log, str(bootstrap), out, control=control)
                plane.watch_runs([s.run_id for s in scenarios])
                tick = plane.tick
            else:
                from runwatch.demo.plane import EmbeddedPlane

                plane = EmbeddedPlane(log, control=control)
                tick = plane.process
            try:
                Orchestrator(out, log, lambda _m: None).run_all(scenarios, tick)
                plane.tick(final=True)
            finally:
                if backend == "kafka":
                    plane.close()
            facts = _facts(log)
            alerts = [e for e in plane.derived if isinstance(e, AlertFired)]
            if backend == "embedded":
                alerts = [e for evs in facts.values() for e in evs if isinstance(e, AlertFired)]
            for s in scenarios:
                mine = [a for a in alerts if a.run_id == s.run_id]
                runs.append({"run": s.run_id, **measure_run(facts.get(s.run_id, []), mine, prices)})
    paged = [x for x in runs if x.get("paged")]
    paused = [x for x in paged if "lag_s" in x]
    return {
        "backend": backend,
        "mode": "controller" if control else "anchor (no controller)",
        "runs": len(runs),
        "paged": len(paged),
        "paused": len(paused),
        "lag_steps_p50": _pct([x["lag_steps"] for x in paused], 0.5),
        "lag_steps_p99": _pct([x["lag_steps"] for x in paused], 0.99),
        "lag_steps_max": max((x["lag_steps"] for x in paused), default=float("nan")),
        "lag_s_p50": _pct([x["lag_s"] for x in paused], 0.5),
        "lag_s_p99": _pct([x["lag_s"] for x in paused], 0.99),
        "lag_s_max": max((x["lag_s"] for x in paused), default=float("nan")),
        "billed_after_s_mean": statistics.fmean([x["billed_after_s"] for x in paged] or [0.0]),
        "usd_after_mean": statistics.fmean([x["usd_after"] for x in paged] or [0.0]),
        "per_run": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kafka", action="store_true", help="also measure on a JVM Kafka broker")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    broker = None
    try:
        backends = ["embedded"]
        if args.kafka:
            from runwatch.broker.provision import start_jvm

            broker = start_jvm()
            backends.append("kafka")
        for backend in backends:
            bootstrap = broker.bootstrap if broker else None
            for control in (True, False):
                rows.append(one_mode(backend, control, args.rounds, bootstrap))
    finally:
        if broker is not None:
            broker.stop()
    by = {(r["backend"], r["mode"]): r for r in rows}
    for r in rows:
        anchor = by.get((r["backend"], "anchor (no controller)"))
        if anchor and anchor["billed_after_s_mean"]:
            r["billed_after_ratio"] = r["billed_after_s_mean"] / anchor["billed_after_s_mean"]
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return
    print(
        f"{'backend':<9} {'mode':<24} {'paged':>5} {'paused':>6} "
        f"{'alert->pause steps p50/p99/max':>31} {'seconds p50/p99/max':>22} "
        f"{'billed after alert (dev-s, USD)':>32} {'ratio':>6}"
    )
    for r in rows:
        steps = f"{r['lag_steps_p50']:.0f} / {r['lag_steps_p99']:.0f} / {r['lag_steps_max']:.0f}"
        secs = f"{r['lag_s_p50']:.2f} / {r['lag_s_p99']:.2f} / {r['lag_s_max']:.2f}"
        billed = f"{r['billed_after_s_mean']:.2f} s, ${r['usd_after_mean']:.5f}"
        ratio = r.get("billed_after_ratio")
        print(
            f"{r['backend']:<9} {r['mode']:<24} {r['paged']:>5} {r['paused']:>6} "
            f"{steps:>31} {secs:>22} {billed:>32} {'' if ratio is None else f'{ratio:.3f}':>6}"
        )


if __name__ == "__main__":
    main()
