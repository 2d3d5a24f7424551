"""``runwatch demo``: several real runs for two tenants, and the plane watching them.

On the embedded default log (no Kafka): real GRPO trainers run as processes (two at a
time), one healthy and the rest each with one real-world failure — constant reward,
oversized LR, a gameable reward, a tenant reward function that hangs and crashes, a
preempted run resumed through the resume gate, and a resume from a checkpoint whose
optimizer state was dropped. While they train, the stream processors and projections
fold the log; alerts and state changes are printed as they happen. At the end: a table
of runs (state, reason, failure class, alerts, spend), detection lags, and a report with
charts in ``--out``. Exit 1 if the plane missed anything a scenario expects.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from runwatch.cli.outdir import fresh_out_dir
from runwatch.cli.terminal import Abort, Terminal

HELP = "train several real runs and show the whole plane working"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runwatch-data/demo", help="output directory")
    parser.add_argument("--short", action="store_true", help="fewer steps (CI)")
    parser.add_argument("--parallel", type=int, default=2, help="trainers at once")
    parser.add_argument("--only", action="append", help="run only these run ids")
    parser.add_argument("--json", action="store_true", help="print the final table as JSON")
    parser.add_argument(
        "--kafka",
        nargs="?",
        const="auto",
        metavar="BOOTSTRAP",
        help="run the plane on a real Kafka broker with the faust-hosted processors "
        "(no value: $KAFKA_BOOTSTRAP_SERVERS, `runwatch kafka up`, or a JVM broker of "
        "the demo's own)",
    )


def run(args: argparse.Namespace, term: Terminal) -> int:
    from events import AlertFired, RunStateChanged
    from runwatch.demo.orchestrate import Orchestrator
    from runwatch.demo.plane import EmbeddedPlane
    from runwatch.demo.report import rows, write_report
    from runwatch.demo.scenarios import scenarios

    if args.kafka:
        import logging

        # aiokafka logs every coordinator re-discovery at ERROR; the demo's output is ours
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    out = Path(args.out)
    chosen = [s for s in scenarios(args.short) if not args.only or s.run_id in args.only]
    if not chosen:
        raise Abort(f"no scenario named {', '.join(args.only or [])}")
    fresh_out_dir(out, "demo")
    log_dir = out / "log"
    started = time.monotonic()
    term.progress(f"runwatch demo: {len(chosen)} runs, 2 tenants, log at {log_dir}")

    last_tick = [0.0]

    def show(events: list) -> None:  # type: ignore[type-arg]
        for ev in events:
            if isinstance(ev, AlertFired):
                term.progress(
                    f"  ALERT  {ev.tenant_id:<7} {ev.run_id:<28} {ev.detector} at step "
                    f"{ev.window_end} [{ev.routing}]: {ev.reason[:90]}"
                )
            elif isinstance(ev, RunStateChanged):
                term.progress(
                    f"  state  {ev.tenant_id:<7} {ev.run_id:<28} {ev.from_state} -> "
                    f"{ev.to_state}" + (f" ({ev.failure_class})" if ev.failure_class else "")
                )

    def tick() -> None:
        if time.monotonic() - last_tick[0] >= 2.0:
            last_tick[0] = time.monotonic()
            show(plane.tick())
        elif hasattr(plane, "process"):  # embedded: the controller acts between ticks
            plane.process()

    report_log = log_dir
    broker = None
    plane = None
    try:
        if args.kafka:
            from dataclasses import replace

            from runwatch import settings
            from runwatch.demo.kafka_plane import KafkaPlane

            bootstrap = settings.kafka_bootstrap(None if args.kafka == "auto" else args.kafka)
            if bootstrap is None:
                from runwatch.broker.provision import start_jvm

                term.progress("starting a Kafka broker of the demo's own (JVM, KRaft) ...")
                broker = start_jvm()
                bootstrap = broker.bootstrap
            else:
                # a shared broker may hold an earlier demo's runs: give these runs fresh ids
                tag = time.strftime("%H%M%S")
                chosen = [replace(s, run_id=f"{s.run_id}-{tag}") for s in chosen]
            term.progress(f"plane on Kafka at {bootstrap}: faust worker + projections follower")
            plane = KafkaPlane(log_dir, bootstrap, out)
            plane.watch_runs([s.run_id for s in chosen])
        else:
            plane = EmbeddedPlane(log_dir)
        outcomes = Orchestrator(out, log_dir, term.progress, args.parallel).run_all(chosen, tick)
        if args.kafka:
            term.progress("  waiting for the processors and projections on Kafka to settle ...")
        show(plane.tick(final=True))
        if args.kafka:
            # the auditor's copy: every topic of the broker, as an embedded log
            import asyncio

            from events.topics import TOPICS
            from runwatch.cli.log import export

            report_log = out / "kafka-export"
            asyncio.run(export(plane.bootstrap, sorted(TOPICS), str(report_log)))
            term.progress(f"  exported the broker's topics to {report_log}")
    finally:
        if args.kafka and plane is not None:
            plane.close()
        if broker is not None:
            broker.stop()
    wall = time.monotonic() - started
    table = rows(chosen, outcomes, plane.views, plane.derived)
    alerts = sum(1 for e in plane.derived if isinstance(e, AlertFired))
    summary = {
        "wall_clock_s": round(wall, 1),
        "runs": len(chosen),
        "events_processed": plane.records,
        "alerts_fired": alerts,
        "state_changes": sum(1 for e in plane.derived if isinstance(e, RunStateChanged)),
        "log": str(log_dir),
        "backend": f"kafka {args.kafka}" if args.kafka else "embedded",
    }
    report = write_report(out / "report", table, report_log, summary)
    summary["report"] = str(report)
    keys = _write_keys(out / "keys.yaml", sorted({s.tenant_id for s in chosen}))
    summary["dashboard"] = (
        f"runwatch serve api --log {report_log} --keys {out / 'keys.yaml'} --port 8000, "
        f"then open http://127.0.0.1:8000/dashboard#key={keys[chosen[0].tenant_id]}"
    )
    if args.json:
        term.json({"summary": summary, "runs": [r.as_dict() for r in table]})
    else:
        term.table(
            [
                (
                    r.tenant_id,
                    r.run_id,
                    r.state,
                    r.failure_class,
                    _short(r.reason, 60),
                    ", ".join(f"{a}@{s}" for a, s in r.first_alert_step.items()) or "-",
                    f"${r.spend_usd:.4f}",
                    "yes" if r.expected_ok else "NO",
                )
                for r in table
            ],
            ["tenant", "run", "state", "class", "reason", "alerts (first step)", "spend", "ok"],
        )
        for r in table:
            if r.resume:
                term.info(f"{r.run_id}: {r.resume}")
            for p in r.problems:
                term.info(f"{r.run_id}: NOT AS EXPECTED: {p}")
        term.info(
            f"{summary['events_processed']} events processed, {alerts} alerts, "
            f"{summary['state_changes']} state changes in {wall:.0f}s; report: {report}"
        )
        term.info(f"customer dashboard: {summary['dashboard']}")
    return 0 if all(r.expected_ok for r in table) else 1


def _write_keys(path: Path, tenants: list[str]) -> dict[str, str]:
    """A fresh API key per tenant (and one operator key) for the dashboard, in the query
    API's keys-file format; returns tenant -> key."""
    import secrets

    import yaml

    keys = {t: f"rk_{t}_{secrets.token_hex(8)}" for t in tenants}
    entries = [{"key": k, "tenant": t} for t, k in keys.items()]
    entries.append({"key": f"rk_ops_{secrets.token_hex(8)}", "operator": True})
    path.write_text(yaml.safe_dump({"keys": entries}, sort_keys=False))
    path.chmod(0o600)
    return keys


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
