"""Resources a sandbox shares with the host, proven against the real sandbox: the disk
and page cache behind the shared ``/usr``, the host-wide mount counter, and the trainer's
own read of the tenant's file (security review, 2026-11-28, second round: F1, F2, F4;
F3, dnotify, is next to the inotify test in ``test_sandbox_isolation.py``).

The checks run as tenant code (``sandbox_support.PROBE``): a failed assertion inside the
sandbox comes back as a ``tenant_crash`` with its traceback in ``outcome.message``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox.client import RewardClient
from sandbox.features import block_devices
from sandbox.types import Cause, OutcomeStatus
from tests.integration.sandbox_support import (
    FAST_LIMITS,
    PROBE,
    item,
    make_client,
    require_sandbox,
    ungated_worker,
)

pytestmark = pytest.mark.timeout(120)

#: A large /usr file nothing on the host runs (the disk-read checks need uncached pages).
BIG_USR_FILE = "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1"
#: A /usr file no sandbox or test imports: its host page cache is the fadvise probe.
QUIET_USR_FILE = "/usr/lib/python3.11/turtle.py"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardClient]:
    require_sandbox()
    c = make_client(tmp_path_factory.mktemp("probe"), PROBE, tier="verifier")
    try:
        yield c
    finally:
        c.close()


def run_ok(client: RewardClient, *codes: str) -> tuple[float, ...]:
    out = client.score([item(c) for c in codes])
    assert out.status is OutcomeStatus.OK, f"{out.cause.value}: {out.message}"
    assert out.scores is not None
    return out.scores


def host_cached_bytes(path: str) -> int:
    """Bytes of ``path`` in the host's page cache (util-linux ``fincore``)."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", path],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[0])


# -- F2: page cache and disk ------------------------------------------------------------


def test_fadvise_dontneed_leaves_the_hosts_page_cache_alone(client: RewardClient) -> None:
    """``posix_fadvise(DONTNEED)`` on a read-only fd of a shared /usr file dropped the
    host's cached pages of it (every tenant's and the host's next read went to disk; a
    flush+reload channel besides). It is a no-op now: the call succeeds, nothing drops."""
    if not shutil.which("fincore") or not os.path.exists(QUIET_USR_FILE):
        pytest.skip("needs util-linux fincore and python3.11's turtle.py")
    with open(QUIET_USR_FILE, "rb") as fh:
        fh.read()
    before = host_cached_bytes(QUIET_USR_FILE)
    assert before > 0
    run_ok(
        client,
        f"""
        import os
        fd = os.open({QUIET_USR_FILE!r}, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # answered 0, did nothing
        os.close(fd)
        """,
    )
    assert host_cached_bytes(QUIET_USR_FILE) == before


def test_o_direct_and_openat2_are_refused_and_plain_opens_still_work(
    client: RewardClient,
) -> None:
    """``O_DIRECT`` reads of /usr went straight to the host's disk (1,985 MiB in 3 s),
    past the page cache and any cgroup: refused with EINVAL at ``open``/``openat`` and at
    ``fcntl(F_SETFL)``; ``openat2`` (flags in a struct) answers ENOSYS."""
    run_ok(
        client,
        f"""
        import ctypes, ctypes.util, errno, fcntl, os
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        path = {BIG_USR_FILE!r}
        def einval(fn):
            try:
                fn()
            except OSError as exc:
                assert exc.errno == errno.EINVAL, exc
            else:
                raise AssertionError('O_DIRECT allowed')
        einval(lambda: os.open(path, os.O_RDONLY | os.O_DIRECT))             # openat
        d = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
        einval(lambda: os.open(os.path.basename(path), os.O_RDONLY | os.O_DIRECT, dir_fd=d))
        assert libc.syscall(2, path.encode(), os.O_RDONLY | os.O_DIRECT) == -1  # open(2)
        assert ctypes.get_errno() == errno.EINVAL
        fd = os.open(path, os.O_RDONLY)                                       # plain: fine
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        einval(lambda: fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT))
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)                 # other flags: fine
        assert os.pread(fd, 4, 0) == b'\\x7fELF'
        os.close(fd)
        how = (ctypes.c_uint64 * 3)(os.O_RDONLY, 0, 0)                        # struct open_how
        assert libc.syscall(437, -100, b'/usr', ctypes.byref(how), 24) == -1  # openat2
        assert ctypes.get_errno() == errno.ENOSYS
        import json, email.parser                                             # imports still work
        with open('/scratch/x', 'w') as fh:
            fh.write('ok')
        assert open('/scratch/x').read() == 'ok'
        """,
    )


def test_without_seccomp_o_direct_opens(tmp_path: Path) -> None:
    """Control for the test above: it is the filter that refuses ``O_DIRECT`` here."""
    from tests.integration.test_sandbox_isolation import worker_ok

    with ungated_worker(tmp_path, PROBE, without=frozenset({"seccomp"})) as w:
        worker_ok(w, f"import os; os.close(os.open({BIG_USR_FILE!r}, os.O_RDONLY | os.O_DIRECT))")


READ_RATE = """
import os, time
fd = os.open({path!r}, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
got, t = 0, time.monotonic()
while got < {nbytes}:
    got += len(os.pread(fd, 1 << 20, {offset} + got))
result = got / (time.monotonic() - t) / (1 << 20)  # MiB/s
os.close(fd)
"""


def test_blkio_caps_the_workers_disk_reads(tmp_path: Path) -> None:
    """Buffered reads that miss the page cache (a tenant streaming /usr through its
    memory cap) went to the disk at its full rate, charged to nothing: each worker's
    tree now sits in a blkio cgroup throttling reads on every host block device."""
    require_sandbox()
    if not os.path.exists(BIG_USR_FILE):
        pytest.skip(f"{BIG_USR_FILE} not on this host")
    limits = replace(FAST_LIMITS, deadline_s=30.0, disk_read_bps=8 << 20, disk_read_iops=400)
    offset, nbytes = 40 << 20, 24 << 20
    with make_client(tmp_path, PROBE, tier="function", limits=limits) as c:
        pool = c._pool
        assert pool is not None
        w, failure = pool.acquire()
        assert w is not None, failure
        try:
            assert "blkio" in w.cgroups
            blkio = w.cgroups["blkio"]
            assert blkio.procs() == w.cgroups["pids"].procs() != set()
            bps = (blkio.path / "blkio.throttle.read_bps_device").read_text().split("\n")
            iops = (blkio.path / "blkio.throttle.read_iops_device").read_text().split("\n")
            dev = os.stat(BIG_USR_FILE).st_dev
            usr = f"{os.major(dev)}:{os.minor(dev)}"
            assert f"{usr} {8 << 20}" in bps and f"{usr} 400" in iops
            assert {line.split()[0] for line in bps if line} <= set(block_devices())
            fd = os.open(BIG_USR_FILE, os.O_RDONLY)  # the host drops the range it reads
            os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            res = w.score([item(READ_RATE.format(path=BIG_USR_FILE, nbytes=nbytes, offset=offset))])
        finally:
            pool.release(w, healthy=False)
    assert res.ok and res.scores is not None, f"{res.cause.value}: {res.message}"
    # 8 MiB/s contracted; unthrottled, this disk gave ~600 MiB/s
    assert res.scores[0] < 8 * 2, f"read {res.scores[0]:.0f} MiB/s past an 8 MiB/s cap"


# -- F4: the host-wide mount counter ----------------------------------------------------


def test_statx_unique_mount_id_and_statmount_listmount_are_refused(
    client: RewardClient,
) -> None:
    """``statx(STATX_MNT_ID_UNIQUE)`` returned the host-wide, never-reused mount id: its
    delta between two batches counted another tenant's sandbox starts exactly (~90
    mounts each). Refused with EPERM; ``statmount``/``listmount`` answer ENOSYS; a
    plain ``statx`` and ``os.stat`` still work."""
    run_ok(
        client,
        """
        import ctypes, ctypes.util, errno, os
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        buf = ctypes.create_string_buffer(256)
        AT_FDCWD, STATX_BASIC_STATS, STATX_MNT_ID_UNIQUE = -100, 0x7ff, 0x4000
        assert libc.syscall(332, AT_FDCWD, b'/usr', 0, STATX_MNT_ID_UNIQUE, buf) == -1
        assert ctypes.get_errno() == errno.EPERM, ctypes.get_errno()
        assert libc.syscall(332, AT_FDCWD, b'/usr', 0, 0xffff, buf) == -1
        assert libc.syscall(332, AT_FDCWD, b'/usr', 0, STATX_BASIC_STATS, buf) == 0
        for nr in (457, 458):  # statmount, listmount
            assert libc.syscall(nr, None, None, 0, 0) == -1
            assert ctypes.get_errno() == errno.ENOSYS, (nr, ctypes.get_errno())
        assert os.stat('/usr').st_ino > 0
        """,
    )


def test_filesystem_free_counts_are_not_readable(client: RewardClient) -> None:
    """``statvfs`` on a /proc mask (a bind of the sandbox base's filesystem), /scratch or
    /usr gave that filesystem's free blocks and inodes, which every other tenant's staged
    artifact and sandbox start move: a tenant read another's artifact size and when its
    client opened and closed (found by review, 224 blocks for a 900 KB artifact).
    ``statfs``, ``fstatfs`` and ``ustat`` answer ENOSYS; ``os.stat`` still works."""
    run_ok(
        client,
        """
        import ctypes, ctypes.util, errno, os
        for path in ('/proc/acpi', '/scratch', '/usr', '/'):
            try:
                os.statvfs(path)
                raise AssertionError(path + ' answered statvfs')
            except OSError as exc:
                assert exc.errno == errno.ENOSYS, (path, exc.errno)
        fd = os.open('/usr', os.O_RDONLY)
        try:
            os.fstatvfs(fd)
            raise AssertionError('fstatvfs answered')
        except OSError as exc:
            assert exc.errno == errno.ENOSYS, exc.errno
        os.close(fd)
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        assert libc.syscall(136, os.stat('/usr').st_dev, ctypes.create_string_buffer(64)) == -1
        assert ctypes.get_errno() == errno.ENOSYS, ctypes.get_errno()
        assert os.stat('/usr').st_ino > 0
        """,
    )


def test_the_mount_namespace_id_ioctl_is_refused(client: RewardClient) -> None:
    """``ioctl(NS_GET_MNTNS_ID)`` on ``/proc/self/ns/mnt`` returned the 64-bit mount
    namespace id, host-wide and never reused: each sandbox start makes one, so its delta
    counted other tenants' sandbox starts as the unique mount id did (found after the
    second round's fix). Every nsfs ioctl is refused with EPERM; other ioctls work."""
    run_ok(
        client,
        """
        import errno, fcntl, os, termios
        fd = os.open('/proc/self/ns/mnt', os.O_RDONLY)
        for cmd in (0x8008B705, 0xB701, 0xB702, 0xB704):  # NS_GET_MNTNS_ID, USERNS, ...
            try:
                fcntl.ioctl(fd, cmd, b'\\0' * 8)
                raise AssertionError(hex(cmd) + ' answered')
            except OSError as exc:
                assert exc.errno == errno.EPERM, (hex(cmd), exc.errno)
        os.close(fd)
        r, w = os.pipe()
        os.write(w, b'abc')
        assert fcntl.ioctl(r, termios.FIONREAD, b'\\0' * 4) == (3).to_bytes(4, 'little')
        """,
    )


def test_timers_aio_pidfds_and_the_netns_cookie_are_refused(client: RewardClient) -> None:
    """Review, 2026-11-28, third round: a POSIX timer delivering SIGCONT continued the
    worker the host had stopped between batches (F1: ``timer_create`` answers ENOSYS;
    ``setitimer`` stays, its signal cannot continue a stopped process); Linux AIO contexts
    come from the host-wide ``fs.aio-max-nr``, which one worker drained for every tenant
    (F3: the AIO calls answer ENOSYS); a pidfd's pidfs inode number counts every process
    created on the host (F7: ``pidfd_open`` ENOSYS, ``clone(CLONE_PIDFD)`` and the
    ``SO_PEERPIDFD``/``SO_PASSPIDFD`` options EPERM); ``SO_NETNS_COOKIE`` is the host-wide
    network-namespace counter (F5: EPERM). Other socket options and ``fork`` still work."""
    run_ok(
        client,
        """
        import ctypes, ctypes.util, errno, os, signal, socket
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        def refused(nr, *args, want=errno.ENOSYS):
            assert libc.syscall(nr, *args) == -1, nr
            assert ctypes.get_errno() == want, (nr, ctypes.get_errno())
        buf = ctypes.create_string_buffer(64)
        refused(222, 1, buf, buf)  # timer_create(CLOCK_MONOTONIC, ...)
        for nr in (206, 207, 208, 209, 210, 333):  # io_setup ... io_pgetevents
            refused(nr, 0, 0, 0, 0, 0)
        refused(434, os.getpid(), 0)  # pidfd_open
        # clone(CLONE_PIDFD | SIGCHLD): refused before any child is made
        refused(56, 0x1000 | signal.SIGCHLD, 0, buf, 0, 0, want=errno.EPERM)
        signal.setitimer(signal.ITIMER_REAL, 0)  # plain timers stay
        a, b = socket.socketpair()
        for opt in (71, 76, 77):  # SO_NETNS_COOKIE, SO_PASSPIDFD, SO_PEERPIDFD
            try:
                a.getsockopt(socket.SOL_SOCKET, opt, 8)
                raise AssertionError(str(opt) + ' answered')
            except OSError as exc:
                assert exc.errno == errno.EPERM, (opt, exc.errno)
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        assert os.waitpid(pid, 0)[1] >> 8 == 7
        """,
    )


# -- F1: the trainer's read of the tenant's file ----------------------------------------


def _sandbox_reward(path: Path):  # type: ignore[no-untyped-def]
    from trainer.config import RewardConfig, TrainerConfig
    from trainer.rewards import RewardFn

    cfg = TrainerConfig(reward=RewardConfig(kind="sandbox", sandbox_path=str(path)))
    return RewardFn(cfg, None)


def test_the_pinned_bytes_are_the_bytes_the_sandbox_runs(tmp_path: Path) -> None:
    """The pin was read at trainer start and the file staged again at the first batch:
    a file changed in between ran under a pin naming other code. The sandbox is now
    handed a private copy of exactly the bytes pinned."""
    require_sandbox()
    path = tmp_path / "reward.py"
    a = b"def reward(batch):\n    return [0.0] * len(batch)\n"
    path.write_bytes(a)
    fn = _sandbox_reward(path)
    try:
        pin = fn.digest()
        path.write_bytes(b"def reward(batch):\n    return [1.0] * len(batch)\n")
        client = fn._sandbox._get_client()
        assert client.artifact_digest == "sha256:" + hashlib.sha256(a).hexdigest()
        out = client.score([{"prompt": "1", "completion": "1"}] * 2)
        assert out.ok and out.scores == (0.0, 0.0), out.message
        assert fn.digest() == pin
    finally:
        fn.close()


def test_an_oversized_reward_file_is_refused_without_being_read(tmp_path: Path) -> None:
    """A reward file over the artifact cap is pinned and refused as
    ``tenant_bad_artifact`` by the client without the trainer reading it whole (the
    peak-memory check is in ``tests/unit/sandbox/test_reward_pin.py``)."""
    path = tmp_path / "reward.py"
    with open(path, "wb") as fh:
        fh.write(b"def reward(batch):\n    return [0.0] * len(batch)\n#")
        fh.truncate(64 << 20)
    fn = _sandbox_reward(path)
    try:
        t = time.monotonic()
        assert fn.digest().startswith("r-")
        assert fn._sandbox.file_digest().startswith("too-large:")
        out = fn._sandbox._get_client().score([{"prompt": "1", "completion": "1"}])
        assert time.monotonic() - t < 30
    finally:
        fn.close()
    assert out.status is OutcomeStatus.REFUSED and out.cause is Cause.TENANT_BAD_ARTIFACT
    assert "larger than" in out.message


def test_without_blkio_the_same_read_runs_at_disk_speed(tmp_path: Path) -> None:
    """Control for the test above: it is the blkio cgroup that caps the read."""
    if not os.path.exists(BIG_USR_FILE):
        pytest.skip(f"{BIG_USR_FILE} not on this host")
    limits = replace(FAST_LIMITS, deadline_s=30.0, disk_read_bps=8 << 20)
    offset, nbytes = 70 << 20, 24 << 20
    with ungated_worker(tmp_path, PROBE, without=frozenset({"cgroup_blkio"}), limits=limits) as w:
        assert "blkio" not in w.cgroups
        fd = os.open(BIG_USR_FILE, os.O_RDONLY)
        os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        res = w.score([item(READ_RATE.format(path=BIG_USR_FILE, nbytes=nbytes, offset=offset))])
    assert res.ok and res.scores is not None, f"{res.cause.value}: {res.message}"
    assert res.scores[0] > 8 * 2, f"unthrottled read only {res.scores[0]:.0f} MiB/s"
