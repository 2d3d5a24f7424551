"""Real trainer runs for the integration tests: ``runwatch train`` killed with SIGKILL
mid-run, and ``runwatch resume`` (subprocesses of the real CLI, run from the repo root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> list[str]:
    """The ``runwatch`` command line for ``args``, in this interpreter."""
    return [sys.executable, "-m", "runwatch.cli.main", *args]


def train_killed(config: Path, log: Path, run_id: str, *args: str, at_step: int = 25) -> int:
    """Run ``runwatch train`` and SIGKILL it once it reports a step >= ``at_step`` (with
    checkpoints every 10 steps: checkpoint 20 exists, 21..at_step recorded); the step it
    reported last. ``args``: more ``train`` options."""
    proc = subprocess.Popen(
        cli("train", "--config", str(config), "--log", str(log), "--run-id", run_id, *args),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    killed_after, lines = None, []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("step ") and int(line.split()[1]) >= at_step:
            os.kill(proc.pid, signal.SIGKILL)
            killed_after = int(line.split()[1])
            break
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL and killed_after is not None, "".join(lines)
    return killed_after


def resume_gate(log: Path, run_id: str, timeout_s: float = 300) -> dict[str, Any]:
    """``runwatch resume --json`` of the run: the gate's outcome (the run finished)."""
    out = subprocess.run(
        cli("resume", "--run-id", run_id, "--log", str(log), "--json", "--quiet"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_for(what: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """``what()``'s first truthy answer, polled every 50 ms; AssertionError after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")
