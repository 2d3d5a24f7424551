"""The offset trace of ``benchmarks/worker_recovery.py --trace-offsets``: reading it back,
and its install into a real interpreter with the faust this project runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.worker_recovery import TRACE_DIR, _ranges, read_trace

ROOT = Path(__file__).resolve().parents[3]


def test_offsets_committed_past_without_a_fold_are_reported_lost(tmp_path: Path) -> None:
    trace = tmp_path / "offsets.trace"
    lines = [  # worker 1 folds 0..4 and commits 5; worker 2 folds 5, 6, then 10 after a gap
        *(f"1 0.0 FOLD 0 {o}" for o in range(5)),
        '1 0.1 COMMIT {"0": 5}',
        "2 1.0 SEEK start",
        '2 1.1 SEEK done committed={"0": 5}',
        "2 1.2 FOLD 0 5",
        "2 1.3 FOLD 0 6",
        "2 1.4 GAP 0 6..10 committed=5",
        "2 1.5 FOLD 0 10",
        '2 1.6 COMMIT {"0": 11}',
        "2 1.7 FOLD 1 0",  # partition 1: folded, never committed: nothing to judge
        "3 2.0 traced",
    ]
    trace.write_text("\n".join(lines) + "\n")
    out = read_trace(trace)
    assert out["partitions"] == {0: {"committed": 11, "folded": 8, "lost": [7, 8, 9]}}
    assert out["gaps"] == ["0 6..10 committed=5"]


def test_ranges_are_printed_compactly() -> None:
    assert _ranges([3, 4, 5, 9, 11, 12]) == "3..5, 9, 11..12"
    assert _ranges([]) == ""


def test_the_trace_installs_on_the_faust_this_project_runs(tmp_path: Path) -> None:
    """Every faust method it wraps exists (a faust upgrade that renames one shows here,
    not as a silent benchmark without a trace)."""
    trace = tmp_path / "offsets.trace"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(TRACE_DIR), str(ROOT))),
        "RUNWATCH_FAUST_TRACE": str(trace),
    }
    done = subprocess.run(
        [sys.executable, "-c", "import faust.transport.consumer as fc; print(fc.Consumer.ack)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "not installed" not in done.stderr
    assert trace.read_text().split()[2:] == ["traced"]
