"""A log in a state runwatch refuses to fold on is said plainly by the CLI (exit 1, the
error's own message), not reported as "a bug in runwatch" with a traceback: here a log
restored from an older copy behind the processors' stored positions (real processes,
real files)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from events.catalog.lifecycle import RunStarted, RunSubmitted
from events.catalog.trainer import StepPhaseTimed
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog

ROOT = Path(__file__).resolve().parents[2]
RUN = "acme:r1"


def _ev(cls: type[EventBase], step: int | None = None, **kw: object) -> EventBase:
    return cls(
        event_id=uuid.uuid4(), tenant_id="acme", run_id=RUN, step=step, ts=time.time(),
        producer="hook/x/1", seq=0, **kw,
    )  # fmt: skip


def _process(log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", "process", "--log", str(log), "--once"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_log_restored_behind_the_processors_is_refused_plainly(tmp_path: Path) -> None:
    log = tmp_path / "log"
    writer = EmbeddedLog(log)
    writer.open_sync()
    writer.append_events_sync([_ev(RunSubmitted, algorithm="grpo"), _ev(RunStarted)])
    writer.append_events_sync([_ev(StepPhaseTimed, s, wall_s=0.1) for s in range(1, 6)])
    older = tmp_path / "older-copy"
    shutil.copytree(log / "runwatch.telemetry", older)
    writer.append_events_sync([_ev(StepPhaseTimed, s, wall_s=0.1) for s in range(6, 11)])
    done = _process(log)
    assert done.returncode == 0, done.stderr
    shutil.rmtree(log / "runwatch.telemetry")
    shutil.copytree(older, log / "runwatch.telemetry")  # an operator restores an old copy
    done = _process(log)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "stored position" in done.stderr and "runwatch.telemetry" in done.stderr
    assert "a bug in runwatch" not in done.stderr and "Traceback" not in done.stderr
