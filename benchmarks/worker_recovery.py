"""Worker recovery: how long processing stalls when the faust worker dies.

    python benchmarks/worker_recovery.py [--bootstrap HOST:PORT] [--rounds 3]
        [--faust-defaults-rounds 1] [--interval 0.1] [--trace-offsets] [--json]

A real ``runwatch process --kafka`` worker (the faust app, its own process group) runs
on a real broker (``--bootstrap``, else one provisioned as the tests do: env, then
testcontainers, then the JVM broker from Maven jars). A probe publisher sends, every
``--interval`` seconds, one ``TrainerStepCompleted`` with a NaN loss for a new run (the
NaN detector answers each with an ``AlertFired`` on ``runwatch.alerts``); a reader
records when each probe's alert appears.

Per round, in turn:

1. **kill**: ``kill -9`` of the worker's process group, then at once a new worker with
   the same app id (and the same ``--instance-id``: static membership). Figure: kill ->
   the first alert of a probe that had none at the kill (processing resumed), and the
   new process's start -> that alert.
2. **anchor, clean restart**: ``SIGTERM``, wait for the exit, start a new worker. Figure:
   SIGTERM -> the first alert of a probe that had none at the stop. A clean restart pays
   the same process start, group join and table recovery, without a dead member: the
   floor under the kill figure.

``--faust-defaults-rounds N`` (default 1) then measures N kills of a worker run with
faust's defaults (no static membership, 60 s session timeout: how ``runwatch process``
ran before), the figure the tuned settings replace. Every alert is also checked for
duplicates by event id (at-least-once redelivery may re-derive an alert; it keeps its
id, so consumers dedupe) and every probe for an answer (nothing lost).

``--trace-offsets`` runs the tuned worker with an offset trace
(``benchmarks/faust_offset_trace/``: what it drained, folded, committed and recorded as a
gap) and reports the telemetry records committed past without being folded, per
partition, with the gaps faust recorded: where the lost probes went (``docs/recovery.md``).
It assumes the telemetry topic starts empty (a provisioned broker; with ``--bootstrap``,
records written before the run would count as lost).

Time semantics: wall clock of this process (``time.monotonic``), the broker and the
worker on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from events.catalog.trainer import TrainerStepCompleted  # noqa: E402
from events.codec import decode, encode  # noqa: E402

#: How ``runwatch process`` ran before issue 16: faust's own group settings.
FAUST_DEFAULTS = ["--instance-id", "", "--session-timeout", "60"]
#: ``--trace-offsets``: its ``sitecustomize`` traces the worker's drains, folds, commits
TRACE_DIR = ROOT / "benchmarks" / "faust_offset_trace"


@dataclass
class Probes:
    """Probe runs sent (run id -> send time) and their first alert (run id -> time)."""

    tag: str
    sent: dict[str, float] = field(default_factory=dict)
    alerted: dict[str, float] = field(default_factory=dict)
    alert_ids: dict[str, int] = field(default_factory=dict)
    n: int = 0

    def next_probe(self) -> tuple[str, bytes]:
        self.n += 1
        run_id = f"probe-{self.tag}-{self.n}"
        ev = TrainerStepCompleted(
            event_id=uuid.uuid4(), tenant_id="bench", run_id=run_id, step=0,
            ts=time.time(), producer="recovery-bench", seq=0, loss=math.nan,
        )  # fmt: skip
        return run_id, encode(ev)

    def unanswered(self) -> set[str]:
        return set(self.sent) - set(self.alerted)

    async def first_alert_after(self, t0: float, timeout_s: float) -> float:
        """When the first alert of a probe sent after ``t0`` appeared (probes sent before
        may have been folded by the worker that was stopped, their alerts in flight)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hits = [at for run, at in self.alerted.items() if self.sent.get(run, 0.0) > t0]
            if hits:
                return min(hits)
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no alert within {timeout_s:.0f} s")


class Worker:
    """``runwatch process --kafka`` as a child process group."""

    def __init__(
        self,
        bootstrap: str,
        app_id: str,
        extra: list[str],
        logdir: Path,
        name: str,
        trace: Path | None = None,
    ) -> None:
        self.name = name
        self.trace = trace
        self.marks: list[tuple[float, str]] = []  # (monotonic time, what happened)
        self.cmd = [
            sys.executable, "-m", "runwatch.cli.main", "process", "--kafka", bootstrap,
            "--app-id", app_id, *extra,
        ]  # fmt: skip
        self.logdir = logdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> float:
        self.starts += 1
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        if self.trace is not None:  # the offset trace's sitecustomize, first on the path
            env["PYTHONPATH"] = os.pathsep.join((str(TRACE_DIR), str(ROOT)))
            env["RUNWATCH_FAUST_TRACE"] = str(self.trace)
        with open(self.logdir / f"{self.name}-{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(
                self.cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.marks.append((time.monotonic(), f"start {self.starts}"))
        return self.marks[-1][0]

    def kill9(self) -> float:
        assert self.proc is not None
        t = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.marks.append((t, "kill -9"))
        return t

    def terminate(self, timeout_s: float = 60.0) -> float:
        assert self.proc is not None
        t = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.marks.append((t, "SIGTERM"))
        self.marks.append((time.monotonic(), "exited"))
        return t

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.terminate(30)


async def measure(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from events.log.kafka import KafkaLog

    async with KafkaLog(bootstrap):
        pass  # registry topics exist before any worker starts
    tag = uuid.uuid4().hex[:8]
    probes = Probes(tag)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await producer.start()
    await consumer.start()
    await at_end(consumer, "runwatch.alerts")

    async def read() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=50)).values():
                now = time.monotonic()
                for rec in records:
                    ev = decode(rec.value)
                    if getattr(ev, "type", "") != "AlertFired" or ev.run_id not in probes.sent:
                        continue
                    probes.alerted.setdefault(ev.run_id, now)
                    key = str(ev.event_id)
                    probes.alert_ids[key] = probes.alert_ids.get(key, 0) + 1

    async def publish() -> None:
        while True:
            run_id, value = probes.next_probe()
            probes.sent[run_id] = time.monotonic()
            await producer.send_and_wait("runwatch.telemetry", value, key=run_id.encode())
            await asyncio.sleep(args.interval)

    tasks = [asyncio.create_task(read()), asyncio.create_task(publish())]
    t0 = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="rw-recovery-"))
    out: dict[str, Any] = {"kill": [], "clean": [], "defaults_kill": [], "logs": str(logdir)}
    workers: list[Worker] = []
    try:
        trace = logdir / "offsets.trace" if args.trace_offsets else None
        tuned = Worker(bootstrap, f"rw-recovery-{tag}", args.worker_arg, logdir, "tuned", trace)
        workers.append(tuned)
        await warm(tuned, probes, args.timeout)
        for _ in range(args.rounds):
            out["kill"].append(await kill_round(tuned, probes, args.timeout))
            out["clean"].append(await clean_round(tuned, probes, args.timeout))
        # nothing lost: every probe sent so far gets its alert from the last worker
        out["unanswered"] = await drain(probes, time.monotonic(), args.timeout)
        out["lost_at"] = [  # when each unanswered probe was sent, beside the worker's marks
            (round(probes.sent[r] - t0, 3), r) for r in out["unanswered"]
        ]
        out["marks"] = [(round(t - t0, 3), what) for t, what in tuned.marks]
        out["duplicate_alerts"] = sum(n - 1 for n in probes.alert_ids.values())
        out["probes"] = len(probes.sent)
        tuned.stop()
        if trace is not None:
            out["trace"] = read_trace(trace)
        if args.faust_defaults_rounds:  # (a new group: it folds every probe again)
            legacy = Worker(
                bootstrap, f"rw-recovery-defaults-{tag}", FAUST_DEFAULTS, logdir, "defaults"
            )
            workers.append(legacy)
            await warm(legacy, probes, args.timeout)
            for _ in range(args.faust_defaults_rounds):
                out["defaults_kill"].append(await kill_round(legacy, probes, args.timeout))
            legacy.stop()
    finally:
        for w in workers:  # (a failed round must not leave a worker folding the broker)
            w.stop()
        for t in tasks:
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        await consumer.stop()
        await producer.stop()
    return out


async def at_end(consumer: Any, topic: str) -> None:
    """Assign every partition of ``topic`` and resolve each position to its end now, so
    no alert written after this call is skipped (a lazily resolved "latest" could land
    past one)."""
    from aiokafka import TopicPartition

    from events.topics import spec

    tps = [TopicPartition(topic, p) for p in range(spec(topic).partitions)]
    consumer.assign(tps)
    ends = await consumer.end_offsets(tps)
    for tp in tps:
        consumer.seek(tp, ends[tp])


async def drain(probes: Probes, until: float, timeout_s: float) -> list[str]:
    """Wait until every probe sent before ``until`` has its alert; those that have none
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [r for r in probes.unanswered() if probes.sent[r] < until]
        if not left:
            return []
        await asyncio.sleep(0.2)
    return sorted(left)


async def warm(worker: Worker, probes: Probes, timeout_s: float) -> None:
    t0 = worker.start()
    await probes.first_alert_after(t0, timeout_s)
    await asyncio.sleep(2.0)  # a steady state: offsets committed, changelogs written


async def kill_round(worker: Worker, probes: Probes, timeout_s: float) -> dict[str, float]:
    await asyncio.sleep(1.0)
    t_kill = worker.kill9()
    t_start = worker.start()
    t_alert = await probes.first_alert_after(t_kill, timeout_s)
    await asyncio.sleep(2.0)
    return {"resumed_s": t_alert - t_kill, "from_start_s": t_alert - t_start}


async def clean_round(worker: Worker, probes: Probes, timeout_s: float) -> dict[str, float]:
    await asyncio.sleep(1.0)
    t_stop = worker.terminate()
    t_start = worker.start()  # (the old worker has exited: it folds nothing sent now)
    t_alert = await probes.first_alert_after(t_start, timeout_s)
    await asyncio.sleep(2.0)
    return {
        "resumed_s": t_alert - t_stop,
        "from_start_s": t_alert - t_start,
        "stop_s": t_start - t_stop,
    }


def read_trace(path: Path) -> dict[str, Any]:
    """What the offset trace shows over every worker of the run, per telemetry partition:
    the highest offset committed, the offsets below it no worker ever folded (committed
    past unprocessed: lost), and the gaps faust recorded (offset ranges it counts as
    acknowledged without a record; on a topic with no compaction and no transactions
    every record exists, so a gap is faust's own bookkeeping)."""
    folded: dict[int, set[int]] = {}
    committed: dict[int, int] = {}
    gaps: list[str] = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4:
            continue
        fact, rest = parts[2], parts[3]
        if fact == "FOLD":
            partition, offset = map(int, rest.split())
            folded.setdefault(partition, set()).add(offset)
        elif fact == "COMMIT":
            for partition, offset in json.loads(rest).items():
                committed[int(partition)] = max(committed.get(int(partition), 0), offset)
        elif fact == "GAP":
            gaps.append(rest)
    partitions = {}
    for partition, top in sorted(committed.items()):
        seen = folded.get(partition, set())
        lost = [o for o in range(top) if o not in seen]
        partitions[partition] = {"committed": top, "folded": len(seen), "lost": lost}
    return {"partitions": partitions, "gaps": gaps, "file": str(path)}


def _fmt(rows: list[dict[str, float]], key: str) -> str:
    vals = [r[key] for r in rows]
    if not vals:
        return "-"
    each = ", ".join(f"{v:.1f}" for v in vals)
    return f"median {statistics.median(vals):.1f} s (each: {each})"


def _ranges(offsets: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3..5, 9"``."""
    runs: list[list[int]] = []
    for o in offsets:
        if runs and o == runs[-1][1] + 1:
            runs[-1][1] = o
        else:
            runs.append([o, o])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def report(out: dict[str, Any]) -> None:
    kill = statistics.median(r["resumed_s"] for r in out["kill"])
    clean = statistics.median(r["resumed_s"] for r in out["clean"])
    print(f"kill -9 -> processing resumed (tuned):   {_fmt(out['kill'], 'resumed_s')}")
    print(f"   of which new worker start -> resumed: {_fmt(out['kill'], 'from_start_s')}")
    print(f"anchor: SIGTERM -> resumed (clean):      {_fmt(out['clean'], 'resumed_s')}")
    print(f"   of which the old worker's stop:       {_fmt(out['clean'], 'stop_s')}")
    print(f"   of which new worker start -> resumed: {_fmt(out['clean'], 'from_start_s')}")
    print(f"ratio kill / clean restart: {kill / clean:.2f} (goal: kill <= 10 s)")
    if out["defaults_kill"]:
        print(f"faust defaults, kill -9 -> resumed:      {_fmt(out['defaults_kill'], 'resumed_s')}")
    if "trace" in out:
        tr = out["trace"]
        lost = sum(len(p["lost"]) for p in tr["partitions"].values())
        print(f"offset trace ({tr['file']}): {len(tr['gaps'])} gaps recorded by faust; "
              f"{lost} telemetry records committed past without being folded")  # fmt: skip
        for partition, p in tr["partitions"].items():
            if p["lost"]:
                print(f"   partition {partition}: {_ranges(p['lost'])}")
    if out["unanswered"]:
        print(f"lost probes (sent at s): {out['lost_at']}; worker marks: {out['marks']}")
    print(
        f"tuned worker: {out['probes']} probes, {len(out['unanswered'])} never answered (lost), "
        f"{out['duplicate_alerts']} alerts derived again after a kill (same event id: "
        f"consumers dedupe); worker logs in {out['logs']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", help="Kafka bootstrap (default: provision a broker)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--faust-defaults-rounds", type=int, default=1)
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between probes")
    ap.add_argument("--timeout", type=float, default=180.0, help="give up a round after this")
    ap.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra argument for the tuned worker (repeatable)",
    )
    ap.add_argument(
        "--trace-offsets",
        action="store_true",
        help="trace the tuned worker's drains, folds, commits and gaps (faust_offset_trace/)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from runwatch.broker.provision import provision

        broker = provision(log=lambda line: print(line, file=sys.stderr))
        bootstrap = broker.bootstrap
        print(f"broker: {broker.describe()}", file=sys.stderr)
    try:
        out = asyncio.run(measure(args, bootstrap))
    finally:
        if broker is not None:
            broker.stop()
    if args.json:
        print(json.dumps(out))
    else:
        report(out)
    return 0 if not out["unanswered"] else 1


if __name__ == "__main__":
    sys.exit(main())
