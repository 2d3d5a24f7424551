"""Red-team round two for the reward sandbox (issue #19, item 4): each attack performed
for real, in a real sandbox (bubblewrap, seccomp, cgroups as ``runwatch sandbox check``
reports them on this host), and each asserted the same three ways:

1. **contained**: what the attack went for did not happen (nothing survives, nothing
   leaks, nothing reaches the host);
2. **booked to the tenant** with the expected ledger cause, in the ledger and in the
   ``RewardBatchFailed`` event (whose ``tenant_id`` is the attacker's);
3. **the pool is healthy for the next tenant**: a neighbour tenant, resident all along,
   scores its next batch, and no process or cgroup of a retired worker is left on the host.

Which earlier test already covers which attack of the issue's list, and what this file
adds, is in ``docs/threat-model.md`` ("Red-team checklist, round two").
"""

from __future__ import annotations

import os
import socket
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox.client import FailurePolicy, RewardClient, ScoreOutcome
from sandbox.features import CGROUP_PARENT, CGROUP_V1_ROOT
from sandbox.isolation import UIDS
from sandbox.pool import REAPER
from sandbox.types import ALL_LAYERS, Cause, OutcomeStatus
from tests.integration.sandbox_support import (
    FAST_LIMITS,
    PROBE,
    item,
    make_client,
    require_sandbox,
)

pytestmark = pytest.mark.timeout(120)

GOOD = """
def reward(batch):
    return [float(len(x["completion"])) for x in batch]
"""
GOOD_BATCH = [{"prompt": "p", "completion": "x" * i} for i in (1, 2, 3)]

#: Returns whatever the item's code builds as ``scores`` (called with the batch length):
#: the raw return value reaches the worker's encoder and the host's gate untouched.
RETURNS = """
def reward(batch):
    ns = {}
    exec(batch[0]["prompt"], ns)
    return ns["scores"](len(batch))
"""


# -- the three checks ---------------------------------------------------------------------


def sandbox_processes() -> set[int]:
    """Host pids running under any sandbox uid this test process handed out (uids are per
    worker, unique on the host), wherever they are: in a cgroup or not."""
    ours, found = UIDS.handed_out(), set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid in ours:
                    found.add(int(d))
            except OSError:
                continue
    return found


def own_cgroups() -> set[str]:
    """This process's sandbox cgroups (named ``<host pid>-<n>``) of every controller."""
    names: set[str] = set()
    for controller in ("pids", "memory", "cpu"):
        parent = Path(CGROUP_V1_ROOT) / controller / CGROUP_PARENT
        if parent.is_dir():
            names |= {d.name for d in parent.iterdir() if d.name.startswith(f"{os.getpid()}-")}
    return names


def proc_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` ("" when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def reaped_by(pid: int, parents: set[int]) -> bool:
    """A zombie whose parent is one of ``parents``."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True  # gone
    return fields[0] == "Z" and int(fields[1]) in parents


#: Clients that stay open across tests (the neighbour): their waiting workers may live.
RESIDENT: list[RewardClient] = []


def assert_nothing_survives(*alive: RewardClient, timeout: float = 8.0) -> None:
    """No process under a sandbox uid and no cgroup of ours is left but those of the
    workers waiting in the pools of ``alive`` and :data:`RESIDENT` clients. Polled until
    ``timeout``: killed processes take a moment to go, and a worker a warm pool is
    spawning counts only once it waits in the pool (most clients here have no warm
    workers, so nothing is spawned behind the test's back)."""
    REAPER.drain()
    deadline = time.monotonic() + timeout
    while True:
        clients = [*alive, *RESIDENT]
        workers = [w for c in clients if c._pool is not None for w in c._pool._ready]
        allowed = set().union(*(w._procs() for w in workers))
        # a process killed while its waiting worker is stopped stays a zombie (no CPU, no
        # memory) until that worker reaps it at its next batch
        strays = {p for p in sandbox_processes() - allowed if not reaped_by(p, allowed)}
        groups = own_cgroups() - {w.name for w in workers}
        if not strays and not groups:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"survived: processes {sorted(strays)}, cgroups {groups}")
        time.sleep(0.05)


def assert_booked(client: RewardClient, out: ScoreOutcome, cause: Cause) -> None:
    """Failed, no scores, booked to ``cause`` in the ledger and in the tenant's event."""
    assert out.status is not OutcomeStatus.OK and out.scores is None, out
    assert out.cause is cause, (out.cause, out.message[-600:])
    assert client.ledger.as_dict()[cause.value] >= 1
    failed = [e for e in client.outcome_events(out) if e.type == "RewardBatchFailed"]
    assert failed and failed[-1].cause == cause.value
    assert failed[-1].tenant_id == client.tenant_id
    assert len(failed[-1].message) <= 2000


def assert_neighbour_scores(neighbour: RewardClient) -> None:
    out = neighbour.score(GOOD_BATCH)
    assert out.status is OutcomeStatus.OK and out.scores == (1.0, 2.0, 3.0), out.message


def attacker(tmp_path: Path, source: str = PROBE, **kw: object) -> RewardClient:
    kw.setdefault("tier", "function")
    kw.setdefault("warm_workers", 0)
    kw.setdefault("policy", FailurePolicy("skip"))
    return make_client(tmp_path, source, tenant="tenant-attacker", **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def neighbour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardClient]:
    """Another tenant, resident in the same host process for the whole module."""
    require_sandbox()
    c = make_client(
        tmp_path_factory.mktemp("neighbour"),
        GOOD,
        tenant="tenant-neighbour",
        tier="function",
        warm_workers=0,
    )
    RESIDENT.append(c)
    try:
        assert_neighbour_scores(c)
        yield c
    finally:
        RESIDENT.remove(c)
        c.close()


# -- state carried between batches of different tenants ----------------------------------

#: Plants state everywhere a worker could keep it (module global, environment, scratch,
#: an abstract UNIX socket, a SysV shared-memory segment), or looks for it and raises
#: naming whatever it finds.
STATEFUL = r"""
import ctypes, ctypes.util, os, socket
PLANTED = []
KEEP = []
libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
SHM_KEY, IPC_CREAT = 0x52570019, 0o1000

def reward(batch):
    out = []
    for item in batch:
        if item['prompt'] == 'plant':
            PLANTED.append(item['completion'])
            os.environ['PLANTED'] = item['completion']
            os.putenv('PLANTED_C', item['completion'])
            with open('/scratch/planted', 'w') as fh:
                fh.write(item['completion'])
            if not KEEP:
                s = socket.socket(socket.AF_UNIX)
                s.bind('\0runwatch-planted')
                s.listen(1)
                KEEP.append(s)
            assert libc.shmget(SHM_KEY, 4096, IPC_CREAT | 0o666) >= 0, ctypes.get_errno()
            out.append(1.0)
            continue
        seen = []
        if PLANTED:
            seen.append(f'module global {PLANTED}')
        if 'PLANTED' in os.environ or b'PLANTED' in open('/proc/self/environ', 'rb').read():
            seen.append('environment')
        if os.listdir('/scratch'):
            seen.append(f'scratch {os.listdir("/scratch")}')
        try:
            socket.socket(socket.AF_UNIX).connect('\0runwatch-planted')
            seen.append('abstract socket')
        except OSError:
            pass
        if libc.shmget(SHM_KEY, 0, 0) >= 0:
            seen.append('sysv shm')
        if seen:
            raise AssertionError('state of another batch: ' + '; '.join(seen))
        out.append(0.0)
    return out
"""
PLANT = [{"prompt": "plant", "completion": "secret-of-tenant-a"}]
LOOK = [{"prompt": "look", "completion": ""}]


def test_no_state_crosses_tenants_in_the_warm_pool(tmp_path: Path) -> None:
    """Tenant A plants state in its warm worker; tenant B, with the very same artifact and
    A's worker alive beside it, finds none of it — not while A is warm, not after A's
    pool is gone and B's workers may reuse A's uids. Control: A's own next batch in the
    same (function-tier) worker does see its module global, environment, socket and shm
    (the worker persists by design), but not its scratch (emptied between batches)."""
    require_sandbox()
    with (
        make_client(tmp_path / "a", STATEFUL, tenant="tenant-a", tier="function") as a,
        make_client(tmp_path / "b", STATEFUL, tenant="tenant-b", tier="function") as b,
    ):
        for _ in range(2):
            planted = a.score(PLANT)
            assert planted.scores == (1.0,), planted.message
            out = b.score(LOOK)
            assert out.status is OutcomeStatus.OK and out.scores == (0.0,), out.message
        control = a.score(LOOK)
        assert control.cause is Cause.TENANT_CRASH
        for trace in ("module global", "environment", "abstract socket", "sysv shm"):
            assert trace in control.message, control.message
        assert "scratch" not in control.message.split("state of another batch:")[-1]
    # A is gone, its uids are free: B's fresh sandboxes (one per batch) may reuse them
    with make_client(tmp_path / "b2", STATEFUL, tenant="tenant-b", tier="verifier") as b:
        for _ in range(3):
            out = b.score(LOOK)
            assert out.status is OutcomeStatus.OK and out.scores == (0.0,), out.message
    assert_nothing_survives()


# -- double fork + setsid: the pid limit and the kill on timeout --------------------------

DAEMONS_THEN_HANG = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                time.sleep(0.01)
        os._exit(0)
time.sleep(60)
"""

DAEMONS_UNTIL_THE_LIMIT = """
import os, time
while True:
    pid = os.fork()          # BlockingIOError (EAGAIN) at the pids limit
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    os.waitpid(pid, 0)       # reap the middle process: only the daemons remain
"""


def test_double_forked_daemons_die_with_the_timed_out_batch(
    tmp_path: Path, neighbour: RewardClient
) -> None:
    require_sandbox()
    limits = replace(FAST_LIMITS, deadline_s=1.5)
    with attacker(tmp_path, limits=limits) as c:
        out = c.score([item(DAEMONS_THEN_HANG)])
        assert_booked(c, out, Cause.TENANT_TIMEOUT)
        assert_nothing_survives(c)
        assert c.score([item("result = 2.0")]).scores == (2.0,)
    assert_neighbour_scores(neighbour)
    assert_nothing_survives()


@pytest.mark.parametrize("without_pids_cgroup", [False, True], ids=["cgroup", "rlimit_nproc"])
def test_double_forked_daemons_stop_at_the_pid_limit(
    tmp_path: Path, neighbour: RewardClient, without_pids_cgroup: bool
) -> None:
    """A new session and a dead parent do not leave the pids cgroup (or the uid that
    RLIMIT_NPROC counts, where the cgroup is missing)."""
    require_sandbox()
    layers = frozenset(ALL_LAYERS) - ({"cgroup_pids"} if without_pids_cgroup else set())
    with attacker(tmp_path, layers=layers) as c:
        out = c.score([item(DAEMONS_UNTIL_THE_LIMIT)])
        assert_booked(c, out, Cause.TENANT_RESOURCE_EXCEEDED)
        assert "BlockingIOError" in out.message, out.message
        assert_nothing_survives(c)
        assert c.score([item("result = 3.0")]).scores == (3.0,)
    assert_neighbour_scores(neighbour)


@pytest.mark.parametrize("without_pids_cgroup", [False, True], ids=["cgroup", "rlimit_nproc"])
def test_a_daemon_of_a_good_batch_is_gone_before_the_next(
    tmp_path: Path, without_pids_cgroup: bool
) -> None:
    """Function tier, worker reused: a double-forked daemon of an ok batch is killed before
    the next batch, also without the pids cgroup (the reset used to find strays through
    that cgroup only: without it the daemon lived on into the next batch)."""
    require_sandbox()
    layers = frozenset(ALL_LAYERS) - ({"cgroup_pids"} if without_pids_cgroup else set())
    daemon = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
        result = float(len([p for p in os.listdir('/proc') if p.isdigit()]))
        """
    look = "import os\nassert sorted(p for p in os.listdir('/proc') if p.isdigit()) == ['1']"
    with attacker(tmp_path, layers=layers, recycle_every=50) as c:
        first = c.score([item(daemon)])
        assert first.ok and first.scores is not None and first.scores[0] >= 2.0, first.message
        assert c._pool is not None and c._pool.spawned == 1
        second = c.score([item(look)])
        assert second.ok, second.message
        assert c._pool.spawned == 1  # the same worker, cleaned
        assert_nothing_survives(c)


# -- tenant code running after ``reward`` returned -----------------------------------------

SPOOFED_THREAD = """
import threading, __main__
CALLS = 0
def reward(batch):
    global CALLS
    CALLS += 1
    if batch[0]['prompt'] == 'leave a thread':
        __main__.thread_count = lambda: 1     # the worker's own report now says 1
        def spin():
            while True:
                pass
        threading.Thread(target=spin, daemon=True).start()
    return [float(CALLS)] * len(batch)
"""


def test_a_thread_left_spinning_is_counted_on_the_host(tmp_path: Path) -> None:
    """Tenant code rewrites the worker's thread report and leaves a spinning thread: the
    host counts the worker's threads itself, retires it, and the thread dies with it."""
    require_sandbox()
    with attacker(tmp_path, SPOOFED_THREAD, recycle_every=50) as c:
        plain = [{"prompt": "plain", "completion": ""}]
        assert c.score(plain).scores == (1.0,)
        left = c.score([{"prompt": "leave a thread", "completion": ""}])
        assert left.ok and left.scores == (2.0,)  # these scores stand (the batch was fine)
        assert c._pool is not None and c._pool._ready == []  # retired, not kept
        assert_nothing_survives(c)
        assert c.score(plain).scores == (1.0,)  # a fresh worker


IDLE_SPINNER = """
import os, signal, threading, time
CALLS = 0
def burn(*_):
    end = time.monotonic() + 0.08
    while time.monotonic() < end:
        pass
if __name__ == 'reward_artifact' and AT_IMPORT == 'thread':
    threading.Thread(target=lambda: [burn() for _ in iter(int, 1)], daemon=True).start()
if __name__ == 'reward_artifact' and AT_IMPORT == 'child' and os.fork() == 0:
    while True:  # burns, and keeps continuing the stopped worker (pid 1)
        burn()
        os.kill(1, signal.SIGCONT)
def reward(batch):
    global CALLS
    CALLS += 1
    if CALLS == 1:
        # the main thread, between batches: a timer's handler runs while the worker waits
        signal.signal(signal.SIGALRM, burn)
        signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
    return [float(CALLS)] * len(batch)
"""


@pytest.mark.parametrize(
    "at_import", ["", "thread", "child"], ids=["timer_handler", "import_thread", "import_child"]
)
def test_no_tenant_code_runs_while_a_worker_waits(tmp_path: Path, at_import: str) -> None:
    """A timer's signal handler (main thread, no extra thread to count), a thread started
    at import, or a process forked at import (which also sends the worker SIGCONT) burns
    CPU while the worker waits for its next batch: the host keeps a waiting worker — and
    what its import started — stopped, so the sandbox uses no CPU at all while it waits.
    (The handler burned ~0.8 cores before.) A worker whose import started a thread or a
    process serves one batch only."""
    require_sandbox()
    source = f"AT_IMPORT = {at_import!r}\n" + IDLE_SPINNER
    with attacker(tmp_path, source, recycle_every=50, warm_workers=1) as c:
        pool = c._pool
        assert pool is not None
        deadline = time.monotonic() + 15
        while not pool._ready and time.monotonic() < deadline:
            time.sleep(0.05)
        if not at_import:
            assert c.score([{"prompt": "p", "completion": ""}]).scores == (1.0,)
        (w,) = pool._ready[:1]
        time.sleep(0.3)
        before = w._cpu_used()
        time.sleep(1.0)
        idle = w._cpu_used() - before
        assert idle < 0.05, f"{idle:.3f} CPU-seconds used by a waiting worker"
        out = c.score([{"prompt": "p", "completion": ""}])
        assert out.ok and out.scores == ((1.0,) if at_import else (2.0,)), out.message
        if at_import:
            assert w.dirty  # started a thread or a process at import: retired after its batch
            assert w not in pool._ready
        assert_nothing_survives(c)


#: Round three (a red-team pass of 2026-11-27): tenant code in the worker (pid 1) whose
#: SIGCHLD handler forks a replacement for every child killed, each child burning CPU,
#: continuing the stopped worker and writing to scratch — the host killed strays while the
#: worker still ran, so one always survived into the wait.
RESPAWNER = """
import os, signal, time
CALLS = 0
def child_body():
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while True:
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass
        try:
            os.kill(1, signal.SIGCONT)
        except OSError:
            pass
        with open('/scratch/alive', 'a') as fh:
            fh.write('x')
def spawn():
    if os.fork() == 0:
        try:
            child_body()
        finally:
            os._exit(0)
def on_chld(*_):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if pid == 0:
            break
    spawn()
def reward(batch):
    global CALLS
    CALLS += 1
    if CALLS == 1:
        signal.signal(signal.SIGCHLD, on_chld)
        spawn()
    return [float(CALLS)] * len(batch)
"""


def test_a_sigchld_handler_cannot_respawn_a_stray_into_the_wait(tmp_path: Path) -> None:
    """The worker is stopped before its strays are killed: nothing but the baseline is
    left in its cgroup while it waits, it uses no CPU, it stays stopped, and scratch is
    empty; the next batch is served by the same worker."""
    require_sandbox()
    with attacker(tmp_path, RESPAWNER, recycle_every=50) as c:
        assert c.score([{"prompt": "p", "completion": ""}]).scores == (1.0,)
        pool = c._pool
        assert pool is not None and pool.spawned == 1
        (w,) = pool._ready
        time.sleep(0.3)
        assert w._procs() == w.baseline
        before = w._cpu_used()
        time.sleep(1.0)
        assert w._cpu_used() - before < 0.05
        assert w.worker_pid is not None and proc_state(w.worker_pid) == "T"
        assert w.scratch is not None and os.listdir(w.scratch) == []
        out = c.score([{"prompt": "p", "completion": ""}])
        assert out.ok and out.scores == (2.0,), out.message
        assert pool.spawned == 1  # the same worker, cleaned again
        assert w._procs() == w.baseline
        assert_nothing_survives(c)


#: Round three, second pass: strays that watch the worker's state and continue it
#: (SIGCONT) a moment after the host has stopped it, racing the host's kill; the worker's
#: SIGCHLD handler then forks a daemon after the kill loop. Each stray waits its own delay.
CONT_RACER = """
import os, signal, time
CALLS = 0
def state1():
    try:
        with open('/proc/1/stat','rb') as f:
            return f.read().rsplit(b')',1)[1].split()[0]
    except OSError:
        return b''
def racer(delay):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while state1() != b'T':
        pass
    end = time.perf_counter() + delay
    while time.perf_counter() < end:
        pass
    os.kill(1, signal.SIGCONT)
    while True:
        time.sleep(1)
def daemon():
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    while True:
        with open('/scratch/daemon', 'a') as fh:
            fh.write('x')
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass
DONE = [False]
def on_chld(*_):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    if DONE[0]:
        return
    DONE[0] = True
    time.sleep(0.15)
    if os.fork() == 0:
        try: daemon()
        finally: os._exit(0)
def reward(batch):
    global CALLS
    CALLS += 1
    DONE[0] = False
    signal.signal(signal.SIGCHLD, on_chld)
    for d in (30e-6, 60e-6, 100e-6, 150e-6, 250e-6, 400e-6, 700e-6, 1.2e-3):
        if os.fork() == 0:
            try: racer(d)
            finally: os._exit(0)
    return [float(CALLS)] * len(batch)
"""


def test_a_stray_continuing_the_stopped_worker_gets_it_retired(tmp_path: Path) -> None:
    """Whether a stray's SIGCONT lands before or after its kill, no waiting worker runs:
    one that was continued (its context switches moved after it was stopped, even if it
    stopped itself again) is retired; every worker left waiting is stopped, alone in its
    cgroup, uses no CPU and has an empty scratch. (Before: about 1 wait in 5 had a daemon
    burning a core and writing to scratch.)"""
    require_sandbox()
    with attacker(tmp_path, CONT_RACER, recycle_every=50) as c:
        for _ in range(10):
            out = c.score([{"prompt": "p", "completion": ""}])
            assert out.ok, out.message
            pool = c._pool
            assert pool is not None
            for w in list(pool._ready):
                time.sleep(0.3)  # past the handler's 150 ms
                assert w.worker_pid is not None and proc_state(w.worker_pid) == "T"
                assert w._procs() == w.baseline
                before = w._cpu_used()
                time.sleep(0.3)
                assert w._cpu_used() - before < 0.02
                assert w.scratch is not None and os.listdir(w.scratch) == []
        assert_nothing_survives(c)


#: The artifact sends the worker's "ready" itself at import, then forks children that burn
#: CPU and continue every process they can see, and never returns from its import: the
#: host stopped the processes it found after "ready", which these forked past.
FORGED_READY = """
import json, os, signal, struct, sys, time
body = json.dumps({"op": "ready"}).encode()
os.write(int(sys.argv[1]), struct.pack(">I", len(body)) + body)
def burn():
    while True:
        end = time.monotonic() + 0.02
        while time.monotonic() < end:
            pass
        for p in os.listdir('/proc'):
            if p.isdigit():
                try:
                    os.kill(int(p), signal.SIGCONT)
                except OSError:
                    pass
def reward(batch):
    return [0.0] * len(batch)
for _ in range(12):
    if os.fork() == 0:
        burn()
while True:
    pass
"""


def test_a_forged_ready_at_import_leaves_nothing_running_in_the_wait(tmp_path: Path) -> None:
    """Whatever the artifact's import started by the time "ready" arrives is killed, the
    worker stopped first: the pre-spawned worker uses no CPU while it waits, and its batch
    is the tenant's timeout, with nothing left behind."""
    require_sandbox()
    with attacker(tmp_path, FORGED_READY, tier="verifier", warm_workers=1) as c:
        pool = c._pool
        assert pool is not None
        deadline = time.monotonic() + 15
        while not pool._ready and time.monotonic() < deadline:
            time.sleep(0.05)
        (w,) = pool._ready[:1]
        time.sleep(0.3)
        assert w._procs() == w.baseline
        before = w._cpu_used()
        time.sleep(1.0)
        assert w._cpu_used() - before < 0.05
        assert_booked(c, c.score([{"prompt": "p", "completion": ""}]), Cause.TENANT_TIMEOUT)
        assert_nothing_survives(c)


PTYS = """
import os
opened = []
for path in ('/dev/ptmx', '/dev/pts/ptmx'):
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NOCTTY))
        opened.append(path)
    except OSError:
        pass
try:
    os.openpty()
    opened.append('openpty')
except OSError:
    pass
with open('/dev/null', 'w') as fh:
    fh.write('x')
with open('/dev/urandom', 'rb') as fh:
    assert len(fh.read(8)) == 8
result = float(len(opened))
"""


def test_no_pty_can_be_opened(tmp_path: Path) -> None:
    """The kernel's pty pool is one for every devpts instance but the host's: a sandbox
    that could open ptys could take them all from other tenants and the host's
    containers. Both ways in are masked; /dev/null and /dev/urandom still work."""
    require_sandbox()
    with attacker(tmp_path) as c:
        out = c.score([item(PTYS)])
        assert out.ok and out.scores == (0.0,), out.message
    assert_nothing_survives()


def test_a_stopped_worker_gets_small_and_large_batches(tmp_path: Path) -> None:
    """The control of the stop: a waiting worker is continued after a small batch is in
    its socket, before a large one (which would not fit the socket's buffer) is sent."""
    require_sandbox()
    with attacker(tmp_path, GOOD, recycle_every=50) as c:
        for size in (1, 900_000, 10, 300_000, 2):  # (scores must stay within 1e6)
            out = c.score([{"prompt": "p", "completion": "x" * size}])
            assert out.ok and out.scores == (float(size),), out.message
        assert c._pool is not None and c._pool.spawned == 1  # one worker, stopped between


# -- floods and oversized or strange return values ----------------------------------------

FLOOD = """
import os, subprocess, sys
chunk = b'x' * (1 << 20)
for _ in range(48):
    os.write(1, chunk)
    os.write(2, chunk)
print('y' * (8 << 20))
print('z' * (8 << 20), file=sys.stderr)
for path in ('/dev/stdout', '/dev/stderr', '/proc/self/fd/1', '/proc/1/fd/2'):
    with open(path, 'wb') as fh:
        fh.write(chunk * 4)
child = 'import os\\nfor _ in range(256):\\n    os.write(2, b"w" * 65536)'
subprocess.run(['/usr/bin/python3', '-c', child])
result = 1.5
"""


def test_stdout_and_stderr_floods_go_nowhere(tmp_path: Path, neighbour: RewardClient) -> None:
    """~170 MiB through stdout/stderr (the worker's, a child's, via /dev and /proc paths):
    all of it is /dev/null inside the sandbox; the host's stderr file of the sandbox does
    not grow and the batch scores."""
    require_sandbox()
    with attacker(tmp_path, tier="verifier") as c:
        pool = c._pool
        assert pool is not None
        w, failure = pool.acquire()
        assert w is not None, failure
        try:
            res = w.score([item(FLOOD)])
            assert res.ok and res.scores == (1.5,), res.message
            w._stderr.seek(0, os.SEEK_END)
            assert w._stderr.tell() < 64 * 1024, w._stderr.tell()
        finally:
            pool.release(w, healthy=False)
        assert_nothing_survives(c)
    assert_neighbour_scores(neighbour)


RETURN_CASES: dict[str, tuple[str, Cause | tuple[float, ...]]] = {
    # 10**7 floats for a batch of 2: refused (wrong shape) before 80 MB of JSON is built
    "ten_million_floats": ("scores = lambda n: [0.5] * 10**7", Cause.TENANT_BAD_OUTPUT),
    "ten_million_tuple": ("scores = lambda n: (0.5,) * 10**7", Cause.TENANT_BAD_OUTPUT),
    # float/int subclasses cross as the plain numbers they are: their methods never run
    # on the host (the worker's JSON encoder writes float.__repr__ / int.__repr__)
    "float_subclass": (
        "class F(float):\n"
        "    def __repr__(self): return 'float(\"nan\")'\n"
        "    def __eq__(self, o): return True\n"
        "    __hash__ = None\n"
        "scores = lambda n: [F(0.25)] * n",
        (0.25, 0.25),
    ),
    "int_subclass": (
        "class I(int):\n    def __repr__(self): return '1e999'\nscores = lambda n: [I(3)] * n",
        (3.0, 3.0),
    ),
    "float_subclass_nan": (
        "class F(float): pass\nscores = lambda n: [F('nan')] * n",
        Cause.TENANT_BAD_OUTPUT,
    ),
    "bool": ("scores = lambda n: [True] * n", Cause.TENANT_BAD_OUTPUT),
    "decimal": (
        "from decimal import Decimal\nscores = lambda n: [Decimal('0.5')] * n",
        Cause.TENANT_BAD_OUTPUT,
    ),
    "fraction": (
        "from fractions import Fraction\nscores = lambda n: [Fraction(1, 2)] * n",
        Cause.TENANT_BAD_OUTPUT,
    ),
    "complex": ("scores = lambda n: [0.5 + 0j] * n", Cause.TENANT_BAD_OUTPUT),
    # what numpy hands back, without numpy (the sandbox has the standard library only):
    # a number-like object with __float__/__index__ but not a float
    "numpy_like": (
        "class float64:\n"
        "    def __float__(self): return 0.5\n"
        "    def __index__(self): return 0\n"
        "scores = lambda n: [float64()] * n",
        Cause.TENANT_BAD_OUTPUT,
    ),
    "int_beyond_float": ("scores = lambda n: [10**400] * n", Cause.TENANT_BAD_OUTPUT),
    "int_beyond_json": ("scores = lambda n: [10**5000] * n", Cause.TENANT_BAD_OUTPUT),
    "generator": ("scores = lambda n: (0.5 for _ in range(n))", Cause.TENANT_BAD_OUTPUT),
    "nested_too_deeply": (
        "def scores(n):\n"
        "    x = []\n"
        "    for _ in range(200_000):\n"
        "        x = [x]\n"
        "    return [x] * n",
        Cause.TENANT_BAD_OUTPUT,
    ),
}


@pytest.mark.parametrize("case", sorted(RETURN_CASES))
def test_return_values_cross_as_plain_numbers_or_are_refused(
    tmp_path: Path, neighbour: RewardClient, case: str
) -> None:
    require_sandbox()
    code, expected = RETURN_CASES[case]
    batch = [item(code), item("")]
    with attacker(tmp_path, RETURNS) as c:
        t0 = time.monotonic()
        out = c.score(batch)
        took = time.monotonic() - t0
        if isinstance(expected, Cause):
            assert_booked(c, out, expected)
        else:
            assert out.ok and out.scores == expected, out.message
            assert all(type(s) is float for s in out.scores)
        assert took < 4.0, f"{took:.1f} s"
        assert_nothing_survives(c)
    assert_neighbour_scores(neighbour)


def test_numpy_is_not_there_and_that_is_the_tenants_crash(tmp_path: Path) -> None:
    """numpy scores cannot happen: tenant code gets the standard library only (a reward
    importing numpy fails at load, booked to the tenant, never to the platform)."""
    require_sandbox()
    with attacker(tmp_path, "import numpy as np\n" + GOOD) as c:
        out = c.score(GOOD_BATCH)
        assert_booked(c, out, Cause.TENANT_CRASH)
        assert "No module named 'numpy'" in out.message, out.message
        assert_nothing_survives(c)


# -- huge messages, deep recursion, forged frames -----------------------------------------

MESSAGE_CASES: dict[str, tuple[str, str]] = {
    # (the item's code, a text the booked message must carry)
    "100_mb_message": ("raise ValueError('x' * (100 << 20))", "ValueError: xxx"),
    "100_mb_custom_exception": (
        "class TenantError(Exception): pass\nraise TenantError('y' * (100 << 20))",
        "TenantError",
    ),
    "str_raises": (
        "class E(Exception):\n    def __str__(self): raise RuntimeError('no')\nraise E()",
        "E: <exception str() failed>",
    ),
    "str_not_a_string": (
        "class E(Exception):\n    def __str__(self): return 42\nraise E()",
        "E: <exception str() failed>",
    ),
    "recursion": ("def f(n): return f(n + 1)\nf(0)", "RecursionError"),
    "c_stack": (
        "import sys\nsys.setrecursionlimit(10**6)\ndef f(n): return f(n + 1)\nf(0)",
        "",
    ),
    "system_exit": ("raise SystemExit(0)", "SystemExit"),
}


@pytest.mark.parametrize("case", sorted(MESSAGE_CASES))
def test_exceptions_huge_or_hostile_are_a_bounded_tenant_crash(
    tmp_path: Path, neighbour: RewardClient, case: str
) -> None:
    """A 100 MB exception message used to kill the worker while it formatted the
    traceback (memory limit): booked as a crash, but the message was lost. It is cut
    before formatting now: a tenant_crash whose message names the exception."""
    require_sandbox()
    code, carries = MESSAGE_CASES[case]
    # the C stack runs out ~190,000 frames deep: seconds of recursion on a loaded box
    limits = replace(FAST_LIMITS, deadline_s=20.0) if case == "c_stack" else FAST_LIMITS
    with attacker(tmp_path, limits=limits) as c:
        out = c.score([item(code)])
        assert_booked(c, out, Cause.TENANT_CRASH)
        assert carries in out.message, out.message[-500:]
        if case.startswith("100_mb"):
            assert "characters cut" in out.message and "worker died" not in out.message
        assert_nothing_survives(c)
        assert c.score([item("result = 6.0")]).scores == (6.0,)
    assert_neighbour_scores(neighbour)


FORGED = {
    # frames written straight onto the worker's socket, past the worker's own encoder
    "nested_200k_deep": b'{"op":"result","id":1,"scores":' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "not_utf8": b'{"op":"result","id":1,"scores":["\xff\xfe"]}',
    "nan_scores": b'{"op":"result","id":1,"scores":[NaN],"threads":1}',
    "huge_number": b'{"op":"result","id":1,"scores":[1' + b"0" * 5000 + b'],"threads":1}',
    "error_with_lone_surrogate": b'{"op":"error","id":1,"kind":"crash","message":"\\ud800"}',
    "wrong_op": b'{"op":"ready"}',
    "not_an_object": b"[1,2,3]",
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_reply_frames_are_bad_output(tmp_path: Path, case: str) -> None:
    require_sandbox()
    code = f"""
        import os, struct, time
        body = {FORGED[case]!r}
        for fd in os.listdir('/proc/self/fd'):  # the worker's socket to the host
            try:
                if os.readlink(f'/proc/self/fd/{{fd}}').startswith('socket:'):
                    os.write(int(fd), struct.pack('>I', len(body)) + body)
            except OSError:
                pass
        time.sleep(30)
        """
    with attacker(tmp_path) as c:
        out = c.score([item(code)])
        expected = Cause.TENANT_CRASH if case == "error_with_lone_surrogate" else None
        assert_booked(c, out, expected or Cause.TENANT_BAD_OUTPUT)
        assert_nothing_survives(c)


# -- ctypes, mmap, AF_UNIX, AF_NETLINK -----------------------------------------------------

SYSCALLS = """
import ctypes, ctypes.util, errno, mmap, os, socket
libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
def denied(rc, want=errno.EPERM):
    return rc == -1 and ctypes.get_errno() == want
# raw syscalls through libc, past Python's socket module (x86-64 and aarch64 numbers)
import platform
SYS = {'x86_64': dict(socket=41, socketpair=53, clone3=435),
       'aarch64': dict(socket=198, socketpair=199, clone3=435)}[platform.machine()]
for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET,
            getattr(socket, 'AF_VSOCK', 40), getattr(socket, 'AF_ALG', 38), 15, 31):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
        assert denied(libc.syscall(SYS['socket'], fam, kind, 0)), (fam, kind)
    pair = (ctypes.c_int * 2)()
    assert denied(libc.syscall(SYS['socketpair'], fam, socket.SOCK_STREAM, 0, pair)), fam
assert denied(libc.syscall(SYS['clone3'], None, 0), errno.ENOSYS)
# netlink through Python, every protocol a tenant might want (route, audit, uevent, ...)
for proto in (0, 4, 9, 15, 16):
    for kind in (socket.SOCK_RAW, socket.SOCK_DGRAM):
        try:
            socket.socket(socket.AF_NETLINK, kind, proto)
            raise AssertionError(f'netlink {kind} {proto} allowed')
        except PermissionError:
            pass
# AF_UNIX is allowed, and reaches nothing outside the sandbox
a, b = socket.socketpair()
a.sendall(b'ok'); assert b.recv(2) == b'ok'
for target in (HOST_ABSTRACT, HOST_PATH):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(target)
        raise AssertionError(f'connected to the host at {target!r}')
    except (ConnectionRefusedError, FileNotFoundError):
        pass
mine = socket.socket(socket.AF_UNIX); mine.bind(SANDBOX_ABSTRACT); mine.listen(1)
import sys; sys.modules['reward_artifact'].KEEP = mine  # alive while the worker waits
# mmap: anonymous memory stops at RLIMIT_AS; an executable mapping is no way around
# seccomp; a shared file mapping cut short is a SIGBUS for the tenant only
try:
    mmap.mmap(-1, 1 << 30)
    raise AssertionError('1 GiB mapped past RLIMIT_AS')
except (OSError, MemoryError):
    pass
rwx = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
rwx.close()
fd = os.memfd_create('x')
try:
    os.ftruncate(fd, 1 << 30)
    raise AssertionError('memfd grown past RLIMIT_FSIZE')
except OSError as exc:
    assert exc.errno == errno.EFBIG, exc
"""


def test_ctypes_mmap_unix_and_netlink_sockets_reach_nothing(
    tmp_path: Path, neighbour: RewardClient
) -> None:
    require_sandbox()
    host_abstract = f"\0runwatch-redteam-{os.getpid()}"
    sandbox_abstract = f"\0runwatch-from-sandbox-{os.getpid()}"
    host_path = str(tmp_path / "host.sock")
    listeners = []
    for addr in (host_abstract, host_path):
        s = socket.socket(socket.AF_UNIX)
        s.bind(addr)
        s.listen(4)
        s.settimeout(0.2)
        listeners.append(s)
    code = (
        f"HOST_ABSTRACT, HOST_PATH, SANDBOX_ABSTRACT = "
        f"{host_abstract!r}, {host_path!r}, {sandbox_abstract!r}\n" + SYSCALLS + "\nresult = 7.0"
    )
    try:
        with attacker(tmp_path / "c") as c:
            out = c.score([item(code)])
            assert out.ok and out.scores == (7.0,), out.message[-1500:]
            # nothing connected to the host's listeners, and the sandbox's is not ours
            for s in listeners:
                with pytest.raises(TimeoutError):
                    s.accept()
            probe = socket.socket(socket.AF_UNIX)
            with pytest.raises(ConnectionRefusedError):
                probe.connect(sandbox_abstract)
            probe.close()
            # uncaught, the same attacks are booked to the tenant
            crash = c.score([item("import ctypes\nctypes.string_at(1)")])
            assert_booked(c, crash, Cause.TENANT_CRASH)
            bus = c.score(
                [
                    item(
                        "import mmap, os\n"
                        "f = open('/scratch/m', 'w+b'); f.truncate(8192)\n"
                        "m = mmap.mmap(f.fileno(), 8192)\n"
                        "f.truncate(0)\n"
                        "m[4096]"
                    )
                ]
            )
            assert_booked(c, bus, Cause.TENANT_CRASH)
            hog = c.score([item("import mmap\nm = [mmap.mmap(-1, 64 << 20) for _ in range(64)]")])
            assert_booked(c, hog, Cause.TENANT_RESOURCE_EXCEEDED)
            assert_nothing_survives(c)
    finally:
        for s in listeners:
            s.close()
    assert_neighbour_scores(neighbour)


# -- the scratch disk ------------------------------------------------------------------------

FILL_CASES = {
    # bytes: five 15 MiB files into a 64 MiB scratch (one file past RLIMIT_FSIZE:
    # test_sandbox_isolation.py::test_file_size_limit)
    "bytes": "for i in range(5):\n    open(f'/scratch/f{i}', 'wb').write(b'x' * (15 << 20))",
    # files: empty files cost no block but ~1 KiB of kernel memory each; the tmpfs bounds
    # their number (without the bound: 166,000 files, 152 MB, until the deadline)
    "inodes": "i = 0\nwhile True:\n    open(f'/scratch/{i}', 'w').close()\n    i += 1",
}


@pytest.mark.parametrize("case", sorted(FILL_CASES))
def test_filling_the_scratch_disk_is_resource_exceeded(
    tmp_path: Path, neighbour: RewardClient, case: str
) -> None:
    require_sandbox()
    from sandbox.isolation import base_dir

    def host_free() -> int:
        st = os.statvfs(base_dir())
        return st.f_bavail * st.f_frsize

    before = host_free()
    with attacker(tmp_path, recycle_every=50) as c:
        t0 = time.monotonic()
        out = c.score([item(FILL_CASES[case])])
        assert_booked(c, out, Cause.TENANT_RESOURCE_EXCEEDED)
        assert time.monotonic() - t0 < 4.0  # stopped by a limit, not by the deadline
        # caught by the tenant, the same fill is an ok batch; the reused worker's next
        # batch finds its scratch empty again (the host emptied it in between)
        caught = f"try:\n{textwrap.indent(FILL_CASES[case], '    ')}\nexcept OSError:\n    pass"
        assert c.score([item(caught)]).ok
        look = "import os\nassert os.listdir('/scratch') == [], len(os.listdir('/scratch'))"
        assert c.score([item(look)]).ok
        assert c._pool is not None and c._pool.spawned == 2  # failed one, then one reused
        assert_nothing_survives(c)
    assert host_free() > before - (32 << 20)  # the host's disk did not take the fill
    assert_neighbour_scores(neighbour)


# -- a reward file that exits or loops at import -------------------------------------------

IMPORT_CASES: dict[str, tuple[str, Cause]] = {
    "os_exit": ("import os\nos._exit(0)\n", Cause.TENANT_CRASH),
    "sys_exit": ("import sys\nsys.exit(3)\n", Cause.TENANT_CRASH),
    "loops": ("while True:\n    pass\n", Cause.TENANT_TIMEOUT),
    "sleeps": ("import time\ntime.sleep(3600)\n", Cause.TENANT_TIMEOUT),
    "daemon_then_exit": (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        while True:\n"
        "            time.sleep(0.01)\n"
        "    os._exit(0)\n"
        "os._exit(0)\n",
        Cause.TENANT_CRASH,
    ),
    "garbage_on_the_socket": (
        "import os\n"
        "for f in os.listdir('/proc/self/fd'):\n"
        "    if os.path.exists(f'/proc/self/fd/{f}') and "
        "os.readlink(f'/proc/self/fd/{f}').startswith('socket:'):\n"
        "        os.write(int(f), b'\\x00\\x00\\x00\\x05hello')\n"
        "import time\ntime.sleep(30)\n",
        Cause.TENANT_BAD_OUTPUT,
    ),
}


@pytest.mark.parametrize("case", sorted(IMPORT_CASES))
def test_a_reward_that_exits_or_loops_at_import(
    tmp_path: Path, neighbour: RewardClient, case: str
) -> None:
    """Tenant code runs from the import on: its exit, loop or garbage there is the
    tenant's (never ``platform_error``), bounded by the start-up deadline, every try."""
    require_sandbox()
    source, cause = IMPORT_CASES[case]
    limits = replace(FAST_LIMITS, startup_s=2.0)
    with attacker(tmp_path, source + GOOD, limits=limits) as c:
        for _ in range(2):
            t0 = time.monotonic()
            out = c.score(GOOD_BATCH)
            assert_booked(c, out, cause)
            assert time.monotonic() - t0 < 2.0 + 2.0
        assert c.ledger.as_dict()["platform_error"] == 0
        assert_nothing_survives(c)
    assert_neighbour_scores(neighbour)


def test_a_reward_that_loops_at_import_costs_one_start_up_deadline_with_a_warm_pool(
    tmp_path: Path,
) -> None:
    """With a warm pool, a batch that waited for the pre-spawning worker used to spawn a
    second one inline after it failed: two start-up deadlines per attempt."""
    require_sandbox()
    limits = replace(FAST_LIMITS, startup_s=2.0)
    source = "while True:\n    pass\n" + GOOD
    with attacker(tmp_path, source, limits=limits, warm_workers=1) as c:
        assert c._pool is not None
        while c._pool.spawned == 0:  # the pool's own spawn is under way
            time.sleep(0.01)
        out = c.score(GOOD_BATCH)
        assert_booked(c, out, Cause.TENANT_TIMEOUT)
        assert c._pool is not None and c._pool.spawned == 1  # one start, not two


# -- issue #20 item 7: which pids layer is in effect ----------------------------------------


@pytest.mark.parametrize("with_cgroup", [True, False], ids=["pids_cgroup", "no_pids_cgroup"])
def test_rlimit_nproc_only_where_the_pids_cgroup_is_missing(
    tmp_path: Path, with_cgroup: bool
) -> None:
    """The pids layer was keyed ``cgroup_pids`` in one place and ``pids`` in the other
    (fixed in 2d6ba62), so RLIMIT_NPROC was set even under the pids cgroup. With the
    cgroup, the worker leaves RLIMIT_NPROC as it inherited it; without, it is the
    contracted ``pids`` (hard = soft)."""
    require_sandbox()
    import resource

    host = resource.getrlimit(resource.RLIMIT_NPROC)
    layers = frozenset(ALL_LAYERS) - (set() if with_cgroup else {"cgroup_pids"})
    with attacker(tmp_path, layers=layers, tier="verifier") as c:
        pool = c._pool
        assert pool is not None
        w, failure = pool.acquire()
        assert w is not None, failure
        try:
            assert ("pids" in w.cgroups) is with_cgroup
            expected = host if with_cgroup else (FAST_LIMITS.pids, FAST_LIMITS.pids)
            res = w.score(
                [
                    item(
                        f"import resource as r\n"
                        f"got = r.getrlimit(r.RLIMIT_NPROC)\n"
                        f"assert got == {expected!r}, got"
                    )
                ]
            )
            assert res.ok, res.message
        finally:
            pool.release(w, healthy=False)
    assert host != (FAST_LIMITS.pids, FAST_LIMITS.pids)  # the two cases differ
