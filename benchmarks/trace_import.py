"""Trace import and profiling throughput on a synthetic seed-003 log of >= 1M lines.

Writes ``step_<N>/worker_<R>.jsonl`` files (:mod:`producers.trace_synth`: long-tailed
requests, 1-3 turns, 10 % over-sampling aborts, one straggler worker) and measures, in
trace lines per second:

- anchor ``json.loads``: reading and parsing every line, nothing else - the floor of any
  Python importer of this format, measured in the same run on the same files;
- ``import``: ``producers.trace_import.import_traces`` into a real embedded log
  (``EmbeddedSink``, fsync'd batch appends of ``--batch-size`` events) - what
  ``runwatch import traces`` does;
- anchor ``read+decode``: reading the traces topic back and decoding every record with
  the codec, nothing else;
- ``process``: reading the log, decoding, folding (``ProfilingFold``) and flushing - the
  embedded host's path and ``runwatch profile LOG``;
- ``import+process``: lines / (import time + process time);
- ``dir->fold``: parsing the directory straight into the fold, no log
  (``runwatch profile DIR``).

Wall-clock and CPU (process) seconds are both printed: the machine is shared, CPU time is
the steadier figure. Usage::

    python benchmarks/trace_import.py [--lines 1000000] [--workers 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from events.log.embedded import EmbeddedLog
from producers.sinks import EmbeddedSink
from producers.trace_import import ImportReport, import_traces, iter_trace_events
from producers.trace_synth import write_synthetic_traces
from stream_processors.profiling import ProfilingFold

LINES_PER_REQUEST = 2.8  # what trace_synth writes on average (turns, tools, reward, aborts)


def timed(fn: Callable[[], int]) -> tuple[int, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    n = fn()
    return n, time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000, help="at least this many lines")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rw-trace-bench-"))
    traces, log_dir = work / "traces", work / "log"
    shutil.rmtree(traces, ignore_errors=True)
    shutil.rmtree(log_dir, ignore_errors=True)
    per_worker = int(args.lines / LINES_PER_REQUEST / args.steps / args.workers) + 1
    t0 = time.perf_counter()
    synth = write_synthetic_traces(
        traces,
        steps=args.steps,
        workers=args.workers,
        requests_per_worker=per_worker,
        abort_share=0.1,
        straggler=(args.steps // 2, 0, 4.0),
        seed=1,
    )
    while synth.lines < args.lines:  # top up with more steps until the target is met
        more = write_synthetic_traces(
            traces,
            steps=1,
            workers=args.workers,
            requests_per_worker=per_worker,
            first_step=synth.steps[-1] + 1,
            seed=synth.steps[-1] + 1,
        )
        synth = type(synth)(
            synth.lines + more.lines, synth.files + more.files, synth.steps + more.steps
        )
    gen_s = time.perf_counter() - t0
    files = sorted(traces.glob("step_*/worker_*.jsonl"))
    size = sum(p.stat().st_size for p in files)

    def parse_only() -> int:
        n = 0
        for p in files:
            with open(p, "rb") as fh:
                for raw in fh:
                    json.loads(raw)
                    n += 1
        return n

    report = ImportReport()

    def do_import() -> int:
        sink = EmbeddedSink(log_dir)
        import_traces(
            traces,
            run_id="bench",
            tenant_id="bench",
            write=sink.write,
            batch_size=args.batch_size,
            report=report,
        )
        sink.close()
        return report.imported

    def read_decode() -> int:
        log = EmbeddedLog(log_dir, readonly=True)
        log.open_sync()
        return sum(1 for _ in log.iter_events(["runwatch.traces"]))

    derived: list[Any] = []

    def process() -> int:
        log = EmbeddedLog(log_dir, readonly=True)
        log.open_sync()
        fold = ProfilingFold()
        state, n = fold.initial(), 0
        for ev in log.iter_events(["runwatch.traces"]):
            state, out = fold.apply(state, ev)
            derived.extend(out)
            n += 1
        derived.extend(fold.flush(state)[1])
        return n

    def dir_fold() -> int:
        fold = ProfilingFold()
        state, n = fold.initial(), 0
        rep = ImportReport()
        for ev in iter_trace_events(traces, run_id="bench", tenant_id="bench", report=rep):
            state, _ = fold.apply(state, ev)
            n += 1
        fold.flush(state)
        return n

    results: dict[str, tuple[int, float, float]] = {}
    results["anchor json.loads"] = timed(parse_only)
    results["import"] = timed(do_import)
    results["anchor read+decode"] = timed(read_decode)
    results["process"] = timed(process)
    n_i, w_i, c_i = results["import"]
    _, w_p, c_p = results["process"]
    results["import+process"] = (n_i, w_i + w_p, c_i + c_p)
    results["dir->fold"] = timed(dir_fold)

    steps = [e for e in derived if e.type == "StepProfiled"]
    stragglers = [e for e in derived if e.type == "StragglerDetected"]
    summary = {
        "lines": synth.lines,
        "files": len(files),
        "bytes": size,
        "steps": len(steps),
        "stragglers": [(s.step, s.worker) for s in stragglers],
        "generate_s": round(gen_s, 2),
        "skipped": report.skipped,
        "rates": {
            k: {
                "lines": n,
                "wall_s": round(w, 3),
                "cpu_s": round(c, 3),
                "lines_per_s_wall": round(n / w),
                "lines_per_s_cpu": round(n / c),
            }
            for k, (n, w, c) in results.items()
        },
    }
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"synthetic log: {synth.lines:,} lines in {len(files)} files "
        f"({size / 1e6:.0f} MB), {len(steps)} steps, generated in {gen_s:.1f}s"
    )
    anchors = {
        "import": "anchor json.loads",
        "dir->fold": "anchor json.loads",
        "process": "anchor read+decode",
        "import+process": "anchor json.loads",
    }
    print(
        f"{'stage':<22}{'lines':>11}{'wall s':>9}{'cpu s':>9}{'lines/s wall':>15}"
        f"{'lines/s cpu':>14}  vs anchor (cpu)"
    )
    for k, (n, w, c) in results.items():
        rel = ""
        if k in anchors:
            an, _, ac = results[anchors[k]]
            rel = f"{(n / c) / (an / ac):.2f}x of {anchors[k]}"
        print(f"{k:<22}{n:>11,}{w:>9.2f}{c:>9.2f}{n / w:>15,.0f}{n / c:>14,.0f}  {rel}")
    print(f"stragglers found: {summary['stragglers']}; lines skipped: {report.skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
