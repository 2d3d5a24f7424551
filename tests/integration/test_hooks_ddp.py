"""A gate pauses and a cancel stops a customer's multi-process run (``torchrun``, two CPU
processes on gloo, a plain ``transformers.Trainer`` with ``RunwatchCallback``:
``tests/integration/ddp_driver.py``).

Found by review: only process zero has a hook, and the callback did not obey in a run of
several processes (blocking process zero alone would hang the others at their next
collective), so on the usual multi-GPU job a fired gate stopped nothing. Now every rank
takes process zero's verdict at each step's end (``producers.hooks.ranks``). The pause
here lasts longer than the process group's timeout (``ddp_timeout``): the other rank
waits through it on process zero's keepalive instead of failing the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from producers.commands import issue
from tests.integration.hooks_support import embedded_events, tiny_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
RUN = "ddp-gated"
DDP_TIMEOUT_S = 6
PAUSED_S = 9.0  # longer than the process group's timeout


def _steps(out: Path, rank: int) -> list[int]:
    path = out / f"steps-rank{rank}.txt"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _launch(tmp_path: Path, steps: int, *extra: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start the job; its output goes to ``out/job.log`` (:func:`_output`), not to a pipe:
    process zero prints a line a step, and a pipe nobody reads while the test waits fills
    after a few hundred steps, blocks process zero in ``print`` and lets the other rank's
    collective time out (``DDP_TIMEOUT_S``), a failure of the test, not of the hook."""
    model = tiny_model_dir(tmp_path / "model")
    log_dir, out = tmp_path / "log", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(ROOT / "tests/integration/ddp_driver.py"),
        str(model), str(log_dir), str(out), RUN, str(steps), str(DDP_TIMEOUT_S), *extra,
    ]  # fmt: skip
    with (out / "job.log").open("wb") as sink:
        job = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,  # killed with what it starts (_stop)
        )  # fmt: skip
    return job, log_dir, out


def _stop(job: subprocess.Popen[bytes], out: Path) -> None:
    """Kill the launcher and its ranks (a rank left behind by a failed test kept training
    through the rest of the suite and slowed it: found in a full run). A rank is any
    process whose arguments name this job's ``out``: ``torchrun`` starts each in a session
    of its own, out of reach of a kill of the launcher's process group, and a rank whose
    launcher died is no longer its child."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    for proc in psutil.process_iter(["cmdline"]):
        if str(out) in (proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    job.wait()


def _output(out: Path) -> str:
    return (out / "job.log").read_text(errors="replace")


def _wait_end(job: subprocess.Popen[bytes], out: Path, timeout_s: float) -> None:
    """Wait for the job to exit; past ``timeout_s`` fail with what it printed."""
    try:
        job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not end in {timeout_s:.0f} s:\n{_output(out)[-3000:]}")


ANSWERS = ("RunPaused", "RunResumed", "RunCancelled", "RunCompleted")


def test_every_rank_of_a_torchrun_job_pauses_and_stops_with_process_zero(tmp_path: Path) -> None:
    job, log_dir, out = _launch(tmp_path, 5000)

    def answers(kinds: tuple[str, ...] = ANSWERS) -> list[str]:
        if not log_dir.is_dir():
            return []
        return [e.type for e in embedded_events(log_dir, RUN) if e.type in kinds]

    def wait(cond, what: str, timeout_s: float = 180.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while not cond():
            if job.poll() is not None or time.monotonic() > deadline:
                _stop(job, out)
                tail = _output(out)[-3000:]
                steps = (_steps(out, 0)[-3:], _steps(out, 1)[-3:])
                pytest.fail(
                    f"waiting for {what}: {answers()}, steps {steps}, rc={job.returncode}\n{tail}"
                )
            time.sleep(0.05)

    try:
        wait(lambda: len(_steps(out, 0)) >= 3 and len(_steps(out, 1)) >= 3, "steps")
        # the run exists once its facts are on the log (a command for a run id with none
        # is refused "no such run"; the hook publishes off the training thread, so its
        # first facts can land after a few steps of a tiny model)
        wait(lambda: log_dir.is_dir() and "RunStarted" in answers(("RunStarted",)), "the run")
        issue(log_dir, RUN, "pause", actor="controller", principal="run_controller",
              reason="kl_blowup (page)")  # fmt: skip
        wait(lambda: answers() == ["RunPaused"], "RunPaused")
        # both ranks hold at the same step's end (the other one may still be on its way
        # there on a busy machine: its marker is written before the hook's callback)
        wait(lambda: _steps(out, 0)[-1:] == _steps(out, 1)[-1:], "both ranks at one step", 60)
        time.sleep(0.5)
        held = (_steps(out, 0), _steps(out, 1))
        time.sleep(PAUSED_S)
        after = (_steps(out, 0), _steps(out, 1))
        assert job.poll() is None, "the job died while paused"
        issue(log_dir, RUN, "resume", actor="customer", principal="acme")
        wait(lambda: len(_steps(out, 1)) >= len(held[1]) + 3, "steps after the resume")
        issue(log_dir, RUN, "cancel", actor="customer", principal="acme")
        _wait_end(job, out, 240)  # both ranks stop at their next step (a loaded box: slowly)
    finally:
        _stop(job, out)
    output = _output(out)
    assert held == after, (
        f"a rank trained while the run was paused: {[h[-3:] for h in held]} -> "
        f"{[a[-3:] for a in after]}"
    )
    assert held[0][-1] == held[1][-1], held  # both held at the same step's end
    assert job.returncode == 0, output[-3000:]
    assert answers() == ["RunPaused", "RunResumed", "RunCancelled"]
    done = sorted(line for line in output.splitlines() if line.startswith("done rank="))
    last = _steps(out, 0)[-1]
    assert done == [f"done rank=0 step={last}", f"done rank=1 step={last}"], output[-3000:]
    assert last < 5000 and _steps(out, 1)[-1] == last  # stopped together, by the cancel


def test_a_callback_on_process_zero_alone_shares_no_verdict_and_kills_nothing(
    tmp_path: Path,
) -> None:
    """Found by review: with the callback on process zero only, its verdict broadcast paired
    with the other rank's own collectives and the job died before its first step. Now the
    ranks agree through the group's store first: the job trains to its end, and process
    zero says why the run's commands are not followed."""
    job, log_dir, out = _launch(tmp_path, 20, "rank0-only")
    try:
        _wait_end(job, out, 300)
    finally:
        _stop(job, out)
    output = _output(out)
    assert job.returncode == 0, output[-3000:]
    assert _steps(out, 0)[-1] == _steps(out, 1)[-1] == 20
    assert "the callback is on 1 of 2 ranks" in output, output[-3000:]
    kinds = [e.type for e in embedded_events(log_dir, RUN)]
    assert kinds.count("StepPhaseTimed") == 20 and kinds[-1] == "RunCompleted"
