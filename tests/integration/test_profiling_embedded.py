"""The profiling fold hosted by the real embedded host over a real embedded log: imported
traces in, profiles and rollout-quality summaries out, across a restart mid-step, and
byte-identical to a from-scratch replay (which, like the live host, never flushes)."""

from __future__ import annotations

from pathlib import Path

from events import RolloutBatchCompleted, StepProfiled, StragglerDetected
from events.codec import encode
from events.log.embedded import EmbeddedLog
from producers.sinks import EmbeddedSink
from producers.trace_import import import_traces
from producers.trace_synth import write_synthetic_traces
from runwatch.hosting.embedded import EmbeddedHost
from runwatch.hosting.replay import replay_processors
from stream_processors.profiling import ProfilingFold


def test_hosted_profiling_survives_a_restart_and_matches_replay(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_synthetic_traces(
        traces, steps=3, workers=4, requests_per_worker=20, abort_share=0.1, straggler=(2, 3, 6.0)
    )
    log = EmbeddedLog(tmp_path / "log")
    log.open_sync()
    sink = EmbeddedSink(log)
    report = import_traces(traces, run_id="run-1", tenant_id="acme", write=sink.write)

    # a small batch makes the host persist its state in the middle of a step
    stats = EmbeddedHost(log, [ProfilingFold()], batch_records=37).run_once()
    assert stats.records == report.imported
    profiles = [e for e in log.iter_events(["runwatch.profiles"]) if isinstance(e, StepProfiled)]
    assert [p.step for p in profiles] == [1, 2]  # step 3 is open until the run ends

    # the next step's traces arrive; a new host (a restart) picks up the saved state and
    # the first trace of step 4 closes step 3
    more = tmp_path / "more"
    write_synthetic_traces(more, steps=1, first_step=4, workers=4, requests_per_worker=20)
    import_traces(more, run_id="run-1", tenant_id="acme", write=sink.write)
    EmbeddedHost(log, [ProfilingFold()], batch_records=37).run_once()
    profiled = list(log.iter_events(["runwatch.profiles"]))
    steps = [e for e in profiled if isinstance(e, StepProfiled)]
    assert [p.step for p in steps] == [1, 2, 3]  # step 4: open until step 5 (or a flush)
    assert all(p.requests == 80 and p.aborted_requests == 8 for p in steps[:3])
    assert [(e.step, e.worker) for e in profiled if isinstance(e, StragglerDetected)] == [(2, "3")]
    quality = [
        e for e in log.iter_events(["runwatch.telemetry"]) if isinstance(e, RolloutBatchCompleted)
    ]
    assert [q.step for q in quality] == [1, 2, 3]

    appended = [encode(e) for e in profiled] + [encode(e) for e in quality]
    replayed = list(
        replay_processors(EmbeddedLog(tmp_path / "log", readonly=True), [ProfilingFold()])
    )
    assert sorted(encode(e) for e in replayed) == sorted(appended)
