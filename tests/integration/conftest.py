"""Fixtures shared by integration modules: one short demo log for the consumers' tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Demo runs that between them write every kind of fact the demo knows: alerts fired and
#: resolved, a pause, a resume with a rollback, a cancel, reward failures, a failed run.
CONSUMER_DEMO_RUNS = ("globex-oversized-lr", "globex-gameable-reward", "acme-flaky-reward")


@pytest.fixture(scope="session")
def consumer_demo_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The log of ``runwatch demo --short`` over :data:`CONSUMER_DEMO_RUNS` (real trainers,
    processors and projections), made once per session."""
    out = tmp_path_factory.mktemp("consumer-demo") / "demo"
    only = [arg for run in CONSUMER_DEMO_RUNS for arg in ("--only", run)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "runwatch.cli.main",
            "demo",
            "--short",
            "--json",
            "--out",
            str(out),
            *only,
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out / "log"
