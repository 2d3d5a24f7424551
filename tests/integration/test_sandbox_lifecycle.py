"""A worker's life, from the host: what it is tied to, what it may spend, when it may run.

Security review of 2026-11-27 (scripts ``t6``, ``t6b``, ``t5``, ``t3``), each performed
for real against real sandboxes:

- bubblewrap's ``--die-with-parent`` is PR_SET_PDEATHSIG, which fires when the *thread*
  that forked the sandbox exits: a worker spawned inline by a ``score()`` from a
  short-lived thread was SIGKILLed in the warm pool, and the honest tenant's next batch
  was booked ``tenant_crash``. Every sandbox is now forked by one long-lived spawner
  thread; a worker found dead before its batch, with no evidence against the tenant, is
  not the tenant's (retried on a fresh worker, unbooked).
- ``cpu_seconds`` was RLIMIT_CPU, per process: a reward forking a fresh child per batch
  spent 10 CPU-s under ``cpu_seconds=3``, every batch ok. The tree's cgroup CPU time is
  now the bound.
- a paused client's warm pool kept pre-spawning, so an artifact whose import never ends
  burned 12.7 CPU-s in 30 s with no ``score()`` call. Pausing now suspends the pool.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox.client import FailurePolicy, RewardClient, ScoreOutcome
from sandbox.isolation import UIDS
from sandbox.pool import REAPER
from sandbox.spawner import SPAWNER
from sandbox.types import Cause, OutcomeStatus
from tests.integration.sandbox_support import FAST_LIMITS, make_client, require_sandbox

pytestmark = pytest.mark.timeout(120)

HONEST = """
import time
def reward(batch):
    time.sleep(0.3)
    return [float(len(x["completion"])) for x in batch]
"""
BATCH = [{"prompt": "p", "completion": "xy"}]


def tenant_columns(client: RewardClient) -> dict[str, int]:
    """The ledger's tenant columns and platform_error that are not zero."""
    return {
        k: v
        for k, v in client.ledger.as_dict().items()
        if v and (k.startswith("tenant_") or k == "platform_error")
    }


def running_sandbox_processes() -> dict[int, float]:
    """Host pid -> CPU seconds of every live (not zombie) process under a sandbox uid of
    this test process. A killed worker can stay a zombie until the host's init reaps it:
    it runs nothing."""
    ours, found = UIDS.handed_out(), {}
    tick = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.stat(f"/proc/{d}").st_uid not in ours:
                continue
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            found[int(d)] = (int(fields[11]) + int(fields[12])) / tick
    return found


# -- 1. a worker's life is the process's, not a thread's -------------------------------------


def test_workers_outlive_the_short_lived_threads_that_spawned_them(tmp_path: Path) -> None:
    """Concurrent ``score()`` calls from a thread pool that is then shut down (review
    ``t6b``): the workers they spawned inline serve the next calls; nothing is booked to
    the tenant (before: each round's next call met a worker SIGKILLed by PDEATHSIG,
    ``tenant_crash`` "worker gone before the batch: BrokenPipeError")."""
    require_sandbox()
    with make_client(tmp_path, HONEST, tier="function", warm_workers=0) as c:
        for _ in range(3):
            with ThreadPoolExecutor(2) as ex:  # its threads end at shutdown
                outs = list(ex.map(lambda _: c.score(BATCH), range(2)))
            box: list[ScoreOutcome] = []
            t = threading.Thread(target=lambda out=box: out.append(c.score(BATCH)))
            t.start()
            t.join()  # and one more call from a thread of its own, gone at once
            time.sleep(0.3)  # a PDEATHSIG would have landed by now
            outs += [*box, c.score(BATCH)]
            for o in outs:
                assert o.status is OutcomeStatus.OK, (o.cause, o.message)
        assert tenant_columns(c) == {}
        assert c._pool is not None and c._pool.spawned <= 2  # the same two workers
    assert SPAWNER.thread is not None and SPAWNER.thread.is_alive()


@pytest.mark.parametrize("target", ["worker", "monitor"])
def test_a_worker_killed_from_outside_while_it_waits_is_not_booked_to_the_tenant(
    tmp_path: Path, target: str
) -> None:
    """The host's OOM killer or an operator SIGKILLs a waiting (stopped) worker, or
    bubblewrap's monitor outside the sandbox: no tenant code ran since the host stopped
    it, so the batch goes to a fresh worker, unbooked (before: ``tenant_crash``)."""
    require_sandbox()
    with make_client(tmp_path, HONEST, tier="function", warm_workers=0) as c:
        assert c.score(BATCH).ok
        assert c._pool is not None
        (w,) = c._pool._ready
        assert w.worker_pid is not None and w.proc is not None
        os.kill(w.worker_pid if target == "worker" else w.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while w.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        out = c.score(BATCH)
        assert out.status is OutcomeStatus.OK and out.attempt == 1, (out.cause, out.message)
        assert tenant_columns(c) == {}
        assert c._pool.spawned == 2  # the dead one, then a fresh one


#: Counts the SIGCONTs it gets between two batches (a batch answers the count: 1, the
#: host's own that continues it for the batch), or, given ``EXIT``, leaves with status 3
#: on the first after its first batch.
RUNS_WHILE_WAITING = """
import os, signal
EXIT = {exit}
WOKE, SCORED = [0], [False]
def on_cont(sig, frame):
    WOKE[0] += 1
    if EXIT and SCORED[0]:
        os._exit(3)
signal.signal(signal.SIGCONT, on_cont)
def reward(batch):
    woke, WOKE[0] = WOKE[0], 0
    SCORED[0] = True
    return [float(woke)] * len(batch)
"""


def _continue_the_waiting_worker(c: RewardClient) -> None:
    """SIGCONT to the stopped worker from the host: the stand-in for the tenant's own
    POSIX timer of the review (``timer_create`` is refused now; a test of that refusal is
    in ``test_sandbox_host_resources.py``), since nothing else of the tenant's runs then."""
    assert c._pool is not None
    (w,) = c._pool._ready
    assert w.worker_pid is not None and w._stopped
    os.kill(w.worker_pid, signal.SIGCONT)
    time.sleep(0.3)


@pytest.mark.parametrize("exits", [False, True], ids=["runs", "exits"])
def test_a_worker_that_ran_while_it_waited_gets_no_batch_and_is_booked_to_the_tenant(
    tmp_path: Path, exits: bool
) -> None:
    """Found by review: a POSIX timer of the tenant's sent its stopped worker SIGCONT after
    the host's last look, and its code ran through every wait between batches (it forked a
    CPU burner, raced the scratch cleanup; exiting in the wait was booked to the platform,
    ``killed_outside``, at every batch). A worker that ran while it waited (its context
    switches moved), or exited then otherwise than by SIGKILL, gets no batch: the attempt
    is the tenant's (``tenant_crash``), and the batch runs on a fresh worker."""
    require_sandbox()
    source = RUNS_WHILE_WAITING.format(exit=exits)
    with make_client(
        tmp_path, source, tier="function", policy=FailurePolicy("retry", 1), warm_workers=0
    ) as c:
        first = c.score(BATCH)
        assert first.ok and first.scores == (1.0,), (first.cause, first.message)
        _continue_the_waiting_worker(c)
        out = c.score(BATCH)
        assert out.status is OutcomeStatus.OK and out.attempt == 2, (out.cause, out.message)
        assert out.scores == (1.0,)  # the fresh worker's: continued by the host alone
        booked = out.attempts[0]
        assert booked.cause is Cause.TENANT_CRASH, booked
        expected = "exited while stopped" if exits else "ran while it waited stopped"
        assert expected in booked.message, booked.message
        assert tenant_columns(c) == {"tenant_crash": 1}
        assert c._pool is not None and c._pool.spawned == 2


# -- 2. cpu_seconds bounds the worker's whole tree -------------------------------------------

SPIN_IN_CHILD = """
import os, time
def spin(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass
def reward(batch):
    pid = os.fork()
    if pid == 0:
        spin(1.2)
        os._exit(0)
    os.waitpid(pid, 0)
    t = os.times()
    return [t.children_user + t.children_system] * len(batch)
"""


def test_cpu_seconds_bounds_the_tree_across_batches(tmp_path: Path) -> None:
    """Each batch spends its CPU in a fresh child (review ``t5``), which RLIMIT_CPU, per
    process, never counted: 4 batches x 2.5 CPU-s under ``cpu_seconds=3``, all ok. Now
    the batch that takes the tree past ``cpu_seconds`` is ``tenant_resource_exceeded``,
    cut within a look (0.1 s) of the limit, and the worker is retired."""
    require_sandbox()
    limits = replace(FAST_LIMITS, cpu_seconds=2, deadline_s=8.0, cpu_cores=1.0)
    with make_client(tmp_path, SPIN_IN_CHILD, tier="function", limits=limits, warm_workers=0) as c:
        first = c.score(BATCH)
        assert first.status is OutcomeStatus.OK, (first.cause, first.message)
        second = c.score(BATCH)
        assert second.cause is Cause.TENANT_RESOURCE_EXCEEDED, (second.cause, second.message)
        assert "cpu_seconds exhausted" in second.message, second.message
        found = re.search(r"used ([0-9.]+) CPU-s", second.message)
        assert found is not None and float(found.group(1)) <= limits.cpu_seconds + 0.5
        # retired, not reused: the next batch starts on a fresh worker with a fresh budget
        assert c._pool is not None and c._pool.spawned == 1
        third = c.score(BATCH)
        assert third.status is OutcomeStatus.OK, (third.cause, third.message)
        assert c._pool.spawned == 2


# -- 3. a paused client runs no tenant code --------------------------------------------------

LOOPS_AT_IMPORT = """
while True:
    pass
def reward(batch):
    return [0.0] * len(batch)
"""

BUSY_IMPORT_THEN_CRASH = """
import time
end = time.process_time() + 0.3
while time.process_time() < end:  # the import costs CPU: tenant code
    pass
def reward(batch):
    if batch[0]["prompt"] == "crash":
        raise RuntimeError("asked to crash")
    return [1.0] * len(batch)
"""


def assert_no_tenant_code_runs(client: RewardClient, seconds: float) -> None:
    """For ``seconds``: no worker started, no sandbox process alive, no CPU spent."""
    assert client._pool is not None
    REAPER.drain()
    time.sleep(0.3)  # the retired workers' teardown
    spawned = client._pool.spawned
    seen: dict[int, float] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.update(running_sandbox_processes())
        time.sleep(0.1)
    assert seen == {}, f"tenant processes ran, no batch asked (pid: CPU-s): {seen}"
    assert client._pool.spawned == spawned, "the pool started workers, no batch asked"


def test_a_paused_client_stops_pre_spawning_an_artifact_that_loops_at_import(
    tmp_path: Path,
) -> None:
    """Review ``t3``: paused after a start-up timeout, the pool went on re-importing the
    artifact every 5 s (12.7 CPU-s of tenant code in 30 s, no ``score()`` call)."""
    require_sandbox()
    limits = replace(FAST_LIMITS, startup_s=1.5, deadline_s=2.0)
    with make_client(
        tmp_path,
        LOOPS_AT_IMPORT,
        tier="function",
        policy=FailurePolicy("pause"),
        limits=limits,
        warm_workers=1,
    ) as c:
        out = c.score(BATCH)
        assert out.status is OutcomeStatus.PAUSED and c.paused, (out.cause, out.message)
        assert out.cause is Cause.TENANT_TIMEOUT
        assert_no_tenant_code_runs(c, 7.0)  # the old backoff was 5 s
        again = c.score(BATCH)
        assert again.status is OutcomeStatus.PAUSED and again.attempt == 0


def test_a_paused_client_keeps_no_warm_worker_and_resume_warms_again(tmp_path: Path) -> None:
    """Paused by a crashing batch with a warm pool: the pool used to replace the retired
    worker at once (the artifact's import, tenant code, ran while paused) and keep it.
    Now the ready workers are retired and none is started until ``resume()``."""
    require_sandbox()
    with make_client(
        tmp_path,
        BUSY_IMPORT_THEN_CRASH,
        tier="function",
        policy=FailurePolicy("pause"),
        warm_workers=1,
    ) as c:
        assert c.score(BATCH).ok
        out = c.score([{"prompt": "crash", "completion": ""}])
        assert out.status is OutcomeStatus.PAUSED and out.cause is Cause.TENANT_CRASH
        assert c._pool is not None and c._pool._ready == []
        assert_no_tenant_code_runs(c, 3.0)
        c.resume()
        deadline = time.monotonic() + 10
        while not c._pool._ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c._pool._ready, "resume() did not pre-spawn again"
        assert c.score(BATCH).ok


def test_the_pool_gives_up_pre_spawning_an_artifact_that_never_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not paused (policy skip), an artifact that loops at import was re-imported by the
    pool every 5 s for as long as the client lived. Now background start-ups back off
    and stop after MAX_BACKGROUND_FAILURES in a row; only a batch's own start-up runs the
    import then. (The backoff's base is shortened so the test takes seconds, not 35 s.)"""
    from sandbox import pool as pool_module

    require_sandbox()
    monkeypatch.setattr(pool_module, "BACKOFF_BASE_S", 0.1)
    limits = replace(FAST_LIMITS, startup_s=1.0, deadline_s=1.0)
    with make_client(
        tmp_path, LOOPS_AT_IMPORT, tier="function", limits=limits, warm_workers=1
    ) as c:
        assert c._pool is not None
        gave_up_after = pool_module.MAX_BACKGROUND_FAILURES
        deadline = time.monotonic() + 30
        while c._pool.spawned < gave_up_after and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c._pool.spawned == gave_up_after, c._pool.spawned
        time.sleep(limits.startup_s + 1.0)  # the last one's start-up deadline, teardown
        # then nothing, for longer than the old fixed 5 s backoff
        assert_no_tenant_code_runs(c, 6.0)
        out = c.score(BATCH)  # a batch still gets its own start-up (and its failure)
        assert out.cause is Cause.TENANT_TIMEOUT, (out.cause, out.message)
        assert_no_tenant_code_runs(c, 1.0)
