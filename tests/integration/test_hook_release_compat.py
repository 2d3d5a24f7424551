"""A customer's training process on the previous release's hook keeps obeying commands
written by this release (the rollout of ``UnpauseRequested`` v2 / ``RunPaused`` v4).

The hook is the code of an earlier commit (``git archive`` of :data:`OLD_RELEASE`, the
last release before the change), run in its own process with only that tree on its
path, following a real embedded log. This release's CLI path pauses it, resumes it and
cancels it: the resume must reach it as a v1 record (its models refuse a v2 one:
``future_schema_version``), because its ``RunPaused`` (v3) does not say it refuses a
stale resume. Skipped only where the repository's history is not there (a shallow copy).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

import pytest

from events.catalog.lifecycle import RunCancelled, RunPaused, RunResumed, RunStarted
from events.codec import encode
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from producers.commands import issue

pytestmark = pytest.mark.timeout(180)

#: the last commit before a resume could name its pause (the previous release's hook)
OLD_RELEASE = "1a37062"
REPO = Path(__file__).resolve().parents[2]
TENANT, RUN = "tenant-a", "tenant-a:old-hook"

DRIVER = """
import sys, time
from producers.hooks.hook import RunwatchHook

hook = RunwatchHook(sys.argv[2], sys.argv[3], log=sys.argv[1], command_poll_s=0.05,
                    install_exit_hooks=False)
hook.start({"model": "tiny"})
step = 0
while step < 5000:
    step += 1
    hook.log({"loss": 1.0 / step}, step)
    hook.step_done(step, wall_s=0.01)
    if hook.obey(step):
        print("cancelled at", step, flush=True)
        break
    time.sleep(0.01)
hook.close(timeout_s=10)
"""


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's ``events`` and ``producers`` packages, extracted."""
    have = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{OLD_RELEASE}^{{commit}}"],
        capture_output=True,
    )
    if have.returncode != 0:
        pytest.skip(f"commit {OLD_RELEASE} is not in this checkout's history (shallow?)")
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", OLD_RELEASE, "events", "producers"],
        capture_output=True,
        check=True,
    ).stdout
    root = tmp_path_factory.mktemp("old-release")
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(root, filter="data")
    (root / "driver.py").write_text(DRIVER)
    return root


def _facts(log: Path) -> list[EventBase]:
    if not log.is_dir():
        return []
    r = EmbeddedLog(log, readonly=True)
    r.open_sync()
    topics = [t for t in ("runwatch.lifecycle",) if t in r.topic_names()]
    return [e for e in r.iter_events(topics) if isinstance(e, EventBase) and e.run_id == RUN]


def _wait(log: Path, cls: type, n: int, proc: subprocess.Popen[str], timeout: float = 60) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = [e for e in _facts(log) if isinstance(e, cls)]
        if len(got) >= n:
            return got
        assert proc.poll() is None, f"the old hook exited: {proc.communicate()}"
        time.sleep(0.05)
    raise AssertionError(f"no {n} {cls.__name__} in {timeout} s")


def test_the_previous_releases_hook_is_paused_resumed_and_cancelled(
    old_tree: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    proc = subprocess.Popen(
        [sys.executable, str(old_tree / "driver.py"), str(log), RUN, TENANT],
        cwd=old_tree,
        env={"PYTHONPATH": str(old_tree), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(log, RunStarted, 1, proc)
        pause = issue(log, RUN, "pause", actor="operator", principal="alice", reason="look")
        assert not pause.refused
        paused = _wait(log, RunPaused, 1, proc)
        # its RunPaused is v3 (upcast here): the old hook does not say it checks
        assert paused[0].request_id == str(pause.command.event_id)
        assert paused[0].refuses_stale_resume is False

        resume = issue(log, RUN, "resume", actor="operator", principal="alice")
        assert not resume.refused and resume.command.answers == ""
        assert json.loads(encode(resume.command))["schema_version"] == 1  # what it reads
        resumed = _wait(log, RunResumed, 1, proc)
        assert resumed[0].request_id == str(resume.command.event_id)

        cancel = issue(log, RUN, "cancel", actor="operator", principal="alice")
        assert not cancel.refused
        _wait(log, RunCancelled, 1, proc)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "cancelled at" in out
        assert "future_schema_version" not in err and "dead" not in err.lower()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
