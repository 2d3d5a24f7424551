"""The sandbox's pid 1, /proc and CPU: attacks from issue #20 performed for real.

Before: pid 1 inside the sandbox was bubblewrap's init, running as the tenant's uid with no
rlimits and the host's stderr file as fd 2; a reward wrote to it through ``/proc/1/mem``
and so wrote 100 MiB to the host disk past every cap, or left it spinning a core between
batches. /proc also told a tenant about the host and other tenants. Now the worker is the
sandbox's pid 1 (``bwrap --as-pid-1``), /proc shows the sandbox's own processes only, CPU
is capped by a cgroup, and nothing of one batch keeps running into the next.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox.types import Cause, OutcomeStatus
from tests.integration.sandbox_support import (
    FAST_LIMITS,
    PROBE,
    item,
    make_client,
    require_sandbox,
    ungated_worker,
)

pytestmark = pytest.mark.timeout(90)

#: Runs inside the sandbox: write into pid 1's memory through /proc/1/mem, then try to
#: reach the host disk through every fd of every process the sandbox can see.
PID1_ATTACK = r"""
import errno, os, resource
assert os.getpid() == 1, os.getpid()
visible = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
assert visible == [1], visible  # no foreign process (no bwrap init) to inject into

# the write itself: find a writable mapping of pid 1 and overwrite it through /proc/1/mem
marker = bytearray(b'runwatch-pid1-' * 8)
addr = None
for line in open('/proc/1/maps'):
    lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
    if line.split()[1].startswith('rw') and lo <= id(marker) < hi:
        addr = lo
with open('/proc/1/mem', 'r+b', buffering=0) as mem:
    mem.seek(addr)
    before = mem.read(16)
    mem.seek(addr)
    mem.write(before)  # the write lands: in the tenant's own process, which gains nothing

# pid 1 carries the tenant's limits ...
limits = open('/proc/1/limits').read()
for name, value in (('Max file size', FSIZE), ('Max address space', AS),
                    ('Max cpu time', CPU), ('Max open files', NOFILE)):
    line = [l for l in limits.splitlines() if l.startswith(name)][0]
    assert line.split()[-3] == str(value), line
# ... and holds no host file: only /dev/null, its socket and what it opens itself
for fd in os.listdir('/proc/1/fd'):
    try:
        target = os.readlink(f'/proc/1/fd/{fd}')
    except OSError:
        continue
    assert target == '/dev/null' or target.startswith(('socket:', '/proc/')), target

# try to write 100 MiB through every fd of pid 1: the file-size cap holds everywhere
chunk = b'x' * (1 << 20)
for fd in os.listdir('/proc/1/fd'):
    try:
        with open(f'/proc/1/fd/{fd}', 'ab', buffering=0) as out:
            for _ in range(100):
                out.write(chunk)
    except OSError as exc:
        assert exc.errno in (errno.EFBIG, errno.EACCES, errno.ENXIO, errno.EROFS,
                             errno.EBADF, errno.ENOENT, errno.EINVAL), exc
"""


def test_pid1_is_the_tenants_own_process_and_its_write_reaches_nothing(tmp_path: Path) -> None:
    require_sandbox()
    lim = FAST_LIMITS
    attack = (
        f"FSIZE, AS, CPU, NOFILE = {lim.file_size_bytes}, {lim.memory_bytes}, "
        f"{lim.cpu_seconds}, {lim.open_files}\n" + PID1_ATTACK
    )
    with make_client(tmp_path, PROBE, tier="verifier", warm_workers=0) as client:
        pool = client._pool
        assert pool is not None
        worker, failure = pool.acquire()
        assert worker is not None, failure
        try:
            result = worker.score([item(attack)])
            assert result.ok, result.message
            # host side: the file behind bubblewrap's stderr did not grow
            worker._stderr.seek(0, os.SEEK_END)
            assert worker._stderr.tell() < 64 * 1024, worker._stderr.tell()
        finally:
            pool.release(worker, healthy=False)


def test_proc_shows_nothing_of_the_host_or_other_tenants(tmp_path: Path) -> None:
    require_sandbox()
    with make_client(tmp_path, PROBE, tier="verifier") as client:
        out = client.score(
            [
                item(
                    """
                    import os
                    for name in ('stat', 'cgroups', 'loadavg', 'meminfo', 'uptime', 'cpuinfo',
                                 'version', 'cmdline', 'kallsyms', 'diskstats', 'mounts'):
                        path = '/proc/' + name
                        if os.path.islink(path):  # mounts -> self/mounts: the sandbox's own
                            continue
                        assert open(path, 'rb').read() == b'', name
                    for d in ('pressure', 'sys', 'irq', 'fs', 'driver'):
                        assert not os.path.isdir('/proc/' + d) or os.listdir('/proc/' + d) == [], d
                    env = open('/proc/1/environ', 'rb').read()
                    assert env in (b'', b'PWD=/scratch\\0'), env
                    cmd = open('/proc/1/cmdline', 'rb').read()
                    assert b'{' not in cmd and b'/run/' not in cmd, cmd  # no limits, no paths
                    info = open('/proc/self/mountinfo').read()
                    assert '/pool-' not in info and '/w-' not in info, info  # no host pids
                    """
                )
            ]
        )
        assert out.status is OutcomeStatus.OK, out.message


SPIN = """
import threading, time
def spin():
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        pass
threads = [threading.Thread(target=spin) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
result = time.process_time()
"""


def test_cpu_is_capped_by_cgroup_at_the_contracted_share(tmp_path: Path) -> None:
    """Three threads spin for 2 s of wall clock; at 0.5 cores they get ~1 CPU-second."""
    require_sandbox()
    limits = replace(FAST_LIMITS, cpu_cores=0.5)
    with make_client(tmp_path, PROBE, tier="verifier", limits=limits) as client:
        out = client.score([item(SPIN)])
        assert out.status is OutcomeStatus.OK, out.message
        assert out.scores is not None
        # uncapped this is ~4 CPU-seconds on 2 cores (3 threads x 2 s, less the GIL's share)
        assert out.scores[0] <= 0.5 * 2.0 * 1.3, out.scores


def test_cpu_seconds_exhausted_is_booked_resource_exceeded(tmp_path: Path) -> None:
    require_sandbox()
    limits = replace(FAST_LIMITS, cpu_seconds=1, cpu_cores=2.0)
    with make_client(tmp_path, PROBE, tier="verifier", limits=limits) as client:
        out = client.score([item("while True: pass")])
        assert out.cause is Cause.TENANT_RESOURCE_EXCEEDED, (out.cause, out.message)


COUNTING = """
import threading, time
CALLS = 0
def reward(batch):
    global CALLS
    CALLS += 1
    if batch[0]['prompt'] == 'leave a thread':
        def spin():
            while True:
                time.sleep(0.001)
        threading.Thread(target=spin, daemon=True).start()
    return [float(CALLS)] * len(batch)
"""


def test_a_thread_left_running_retires_the_worker(tmp_path: Path) -> None:
    """Function tier reuses its worker — unless tenant code left a thread running."""
    require_sandbox()
    with make_client(tmp_path, COUNTING, tier="function", recycle_every=50) as client:
        plain = {"prompt": "plain", "completion": ""}
        assert client.score([plain]).scores == (1.0,)
        assert client.score([plain]).scores == (2.0,)  # same worker: reused
        left = client.score([{"prompt": "leave a thread", "completion": ""}])
        assert left.status is OutcomeStatus.OK and left.scores == (3.0,)
        # the worker with the thread was retired: a fresh process counts from 1
        assert client.score([plain]).scores == (1.0,)


def test_nothing_but_pid1_survives_into_the_next_batch(tmp_path: Path) -> None:
    """A double-forked, setsid daemon from batch 1 is killed and reaped before batch 2."""
    require_sandbox()
    with make_client(tmp_path, PROBE, tier="function", recycle_every=50) as client:
        first = client.score(
            [
                item(
                    """
                    import os, time
                    if os.fork() == 0:
                        os.setsid()
                        if os.fork() == 0:
                            time.sleep(60)
                        os._exit(0)
                    time.sleep(0.2)
                    assert len([p for p in os.listdir('/proc') if p.isdigit()]) >= 2
                    result = float(os.getpid())
                    """
                )
            ]
        )
        assert first.status is OutcomeStatus.OK and first.scores == (1.0,), first.message
        second = client.score(
            [
                item(
                    """
                    import os
                    pids = sorted(p for p in os.listdir('/proc') if p.isdigit())
                    assert pids == ['1'], pids  # killed by the host, reaped by the worker
                    """
                )
            ]
        )
        assert second.status is OutcomeStatus.OK, second.message


def test_control_without_own_pid1_bubblewraps_init_is_foreign_and_unlimited(
    tmp_path: Path,
) -> None:
    """The layer is what holds: without it pid 1 is bubblewrap, writable through
    /proc/1/mem by the tenant's uid, and without the tenant's file-size cap. (A worker
    started below the tier gate: no tier runs without the layer any more.)"""
    with ungated_worker(tmp_path, PROBE, without=frozenset({"own_pid1"})) as worker:
        out = worker.score(
            [
                item(
                    f"""
                    import os
                    assert os.getpid() != 1
                    assert b'bwrap' in open('/proc/1/cmdline', 'rb').read()
                    open('/proc/1/mem', 'r+b').close()  # writable by the tenant
                    fsize = [l for l in open('/proc/1/limits').read().splitlines()
                             if l.startswith('Max file size')][0]
                    assert 'unlimited' in fsize and '{FAST_LIMITS.file_size_bytes}' not in fsize
                    """
                )
            ]
        )
        assert out.ok, out.message
