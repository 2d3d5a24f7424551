"""Each isolation layer, proven from inside a real sandbox (seed 002 red-team checklist).

The checks run as tenant code (see ``sandbox_support.PROBE``): a failed assertion inside
the sandbox comes back as a ``tenant_crash`` with its traceback in ``outcome.message``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.client import RewardClient
from sandbox.types import ALL_LAYERS, Cause, OutcomeStatus, Tier
from sandbox.worker import SandboxWorker
from tests.integration.sandbox_support import (
    FAST_LIMITS,
    PROBE,
    item,
    make_client,
    require_sandbox,
    ungated_worker,
)

pytestmark = pytest.mark.timeout(60)

REPO = str(Path(__file__).resolve().parents[2])
SECRET = "rw-test-secret-4b1d"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardClient]:
    require_sandbox()
    os.environ["RUNWATCH_TEST_SECRET"] = SECRET
    c = make_client(tmp_path_factory.mktemp("probe"), PROBE, tier="verifier")
    try:
        yield c
    finally:
        c.close()
        os.environ.pop("RUNWATCH_TEST_SECRET", None)


def run_ok(client: RewardClient, *codes: str) -> tuple[float, ...]:
    out = client.score([item(c) for c in codes])
    assert out.status is OutcomeStatus.OK, f"{out.cause.value}: {out.message}"
    assert out.scores is not None
    return out.scores


def worker_ok(worker: SandboxWorker, *codes: str) -> tuple[float, ...]:
    """``run_ok`` for a worker started below the gate (``ungated_worker``)."""
    res = worker.score([item(c) for c in codes])
    assert res.ok, f"{res.cause.value}: {res.message}"
    assert res.scores is not None
    return res.scores


@pytest.fixture
def loopback_tcp() -> Iterator[tuple[int, list[object]]]:
    """A TCP listener on the host's loopback that records any connection it accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    got: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
                got.append(addr)
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], got
    finally:
        stop.set()
        t.join(1)
        srv.close()


# -- identity and environment -----------------------------------------------------------


def test_runs_as_unprivileged_uid_and_gid_without_capabilities(client: RewardClient) -> None:
    run_ok(
        client,
        """
        import os
        assert os.getuid() != 0 and os.geteuid() != 0, os.getuid()
        assert os.getgid() != 0 and os.getegid() != 0, os.getgid()
        assert os.getgroups() in ([], [os.getgid()]), os.getgroups()
        status = open('/proc/self/status').read()
        cap_eff = [l for l in status.splitlines() if l.startswith('CapEff')][0].split()[1]
        assert int(cap_eff, 16) == 0, cap_eff
        """,
    )
    # on the host, the worker's processes belong to that uid, not to root
    pool = client._pool
    assert pool is not None
    w, failure = pool.acquire()
    assert w is not None, failure
    try:
        host_uids = {os.stat(f"/proc/{pid}").st_uid for pid in w._procs()}
        assert host_uids and 0 not in host_uids, host_uids
        assert host_uids == {w.uid}
    finally:
        pool.release(w, healthy=False)


def test_environment_is_empty_and_holds_no_secrets(client: RewardClient) -> None:
    assert os.environ["RUNWATCH_TEST_SECRET"] == SECRET
    run_ok(
        client,
        f"""
        import os
        assert dict(os.environ) == {{}}, dict(os.environ)
        for pid in ('self', '1'):
            raw = open(f'/proc/{{pid}}/environ', 'rb').read()
            assert b'{SECRET}' not in raw and b'HOME=/root' not in raw, (pid, raw[:200])
        """,
    )


# -- network ----------------------------------------------------------------------------


def test_own_network_namespace_without_routes(client: RewardClient) -> None:
    host_net = os.readlink("/proc/self/ns/net")
    run_ok(
        client,
        f"""
        import os
        assert os.readlink('/proc/self/ns/net') != {host_net!r}
        devs = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
        assert devs == ['lo'], devs
        routes = open('/proc/net/route').read().splitlines()[1:]
        assert routes == [], routes
        """,
    )


def test_tcp_udp_dns_egress_refused_including_host_loopback(
    client: RewardClient, loopback_tcp: tuple[int, list[object]]
) -> None:
    port, accepted = loopback_tcp
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.3)
    try:
        run_ok(
            client,
            f"""
            import socket, errno
            for fam, kind in ((socket.AF_INET, socket.SOCK_STREAM),
                              (socket.AF_INET, socket.SOCK_DGRAM),
                              (socket.AF_INET6, socket.SOCK_STREAM),
                              (socket.AF_NETLINK, socket.SOCK_RAW),
                              (socket.AF_PACKET, socket.SOCK_RAW)):
                try:
                    socket.socket(fam, kind)
                    raise AssertionError(f'socket {{fam}} allowed')
                except PermissionError:
                    pass
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=1)
                raise AssertionError('tcp to host loopback connected')
            except PermissionError:
                pass
            try:
                socket.getaddrinfo('pypi.org', 443)
                raise AssertionError('dns resolved')
            except (socket.gaierror, PermissionError, OSError):
                pass
            """,
        )
        with pytest.raises(TimeoutError):
            udp.recvfrom(100)
    finally:
        udp.close()
    time.sleep(0.3)
    assert accepted == []


def test_network_namespace_alone_blocks_host_loopback(
    tmp_path: Path, loopback_tcp: tuple[int, list[object]]
) -> None:
    """Without seccomp the netns still blocks egress (a worker started below the tier
    gate: no tier runs without seccomp any more)."""
    require_sandbox()
    port, accepted = loopback_tcp
    with ungated_worker(tmp_path, PROBE, without=frozenset({"seccomp"})) as w:
        assert "seccomp" not in w.config.layers
        worker_ok(
            w,
            f"""
            import socket
            s = socket.socket()  # allowed: no seccomp in this configuration
            s.settimeout(1)
            rc = s.connect_ex(('127.0.0.1', {port}))
            assert rc != 0, 'connected to the host loopback'
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                u.sendto(b'x', ('10.0.0.1', 53))
                raise AssertionError('udp egress possible')
            except OSError:
                pass
            """,
        )
    time.sleep(0.3)
    assert accepted == []


# -- seccomp ----------------------------------------------------------------------------


def test_seccomp_denies_ptrace_mount_unshare_bpf(client: RewardClient) -> None:
    run_ok(
        client,
        """
        import ctypes, ctypes.util, errno, os
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        status = open('/proc/self/status').read()
        assert 'Seccomp:\\t2' in status, status
        def denied(rc):
            return rc == -1 and ctypes.get_errno() == errno.EPERM
        assert denied(libc.ptrace(0, 0, None, None)), 'ptrace TRACEME allowed'
        assert denied(libc.mount(b'none', b'/scratch', b'tmpfs', 0, None)), 'mount allowed'
        assert denied(libc.unshare(0x10000000)), 'unshare(CLONE_NEWUSER) allowed'
        assert denied(libc.syscall(321, 0, None, 0)), 'bpf allowed'
        # inotify/fanotify on the shared read-only /usr saw other tenants' imports
        assert denied(libc.inotify_init1(0)), 'inotify allowed'
        assert denied(libc.syscall(300, 0, 0)), 'fanotify_init allowed'
        try:
            os.unshare  # py3.12+
        except AttributeError:
            pass
        """,
    )


def test_dnotify_on_the_shared_usr_is_denied(client: RewardClient) -> None:
    """``fcntl(F_NOTIFY)`` (dnotify) is the older interface to the fsnotify events the
    inotify denial closed: a watch on a read-only /usr directory fd saw another tenant's
    sandbox import ``json`` and ``email`` (security review, 2026-11-28, second round,
    F3). Denied with EPERM; other ``fcntl`` commands still work."""
    run_ok(
        client,
        """
        import errno, fcntl, os
        F_NOTIFY, DN_ACCESS, DN_MULTISHOT = 1026, 0x1, 0x80000000
        fd = os.open('/usr/lib/python3.11/json', os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.fcntl(fd, F_NOTIFY, DN_ACCESS | DN_MULTISHOT)
            raise AssertionError('dnotify allowed')
        except PermissionError:
            pass
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        os.close(fd)
        """,
    )


SYSINFO = """
import ctypes, ctypes.util, errno
libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
buf = ctypes.create_string_buffer(256)  # struct sysinfo: uptime, loads, RAM, procs, ...
rc = libc.sysinfo(buf)
assert rc == -1 and ctypes.get_errno() == errno.EPERM, (rc, ctypes.get_errno())
assert buf.raw == bytes(256), 'sysinfo wrote host figures'
"""


@pytest.mark.parametrize("tier", ["verifier", "function"])
def test_sysinfo_is_denied_so_host_load_memory_and_process_count_stay_hidden(
    tmp_path: Path, tier: str
) -> None:
    """sysinfo(2) gave what the /proc masks hide: the host's load averages, free and total
    RAM, uptime and host-wide process count; tenant A watched tenant B's 20 forks come and
    go in it (security review 2026-11-27, ``t1``, ``t1b``). Denied with EPERM."""
    require_sandbox()
    with make_client(tmp_path, PROBE, tier=tier) as c:
        run_ok(c, SYSINFO)


def test_without_seccomp_sysinfo_shows_the_host(tmp_path: Path) -> None:
    """Control for the test above: it is the filter that denies sysinfo."""
    with ungated_worker(tmp_path, PROBE, without=frozenset({"seccomp"})) as w:
        worker_ok(
            w,
            """
            import ctypes, ctypes.util
            libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
            buf = ctypes.create_string_buffer(256)
            assert libc.sysinfo(buf) == 0 and buf.raw != bytes(256)
            """,
        )


SNEAKY = """
import builtins
imp = getattr(builtins, "__imp" + "ort__")
ct = imp("ct" + "ypes")
def reward(batch):
    return [float(ct.CDLL(None).unshare(0x10000000 | 0x40000000))] * len(batch)
"""


@pytest.mark.parametrize("explicit_tier", [None, "function"])
def test_no_tier_runs_where_the_verifier_tier_is_refused(
    tmp_path: Path, explicit_tier: Tier | None
) -> None:
    """An import hidden from the classifier (``getattr(builtins, "__imp"+"ort__")``) gets
    an artifact the function tier; on a host without seccomp that tier ran it without
    the filter (unshare(NEWUSER|NEWNET) = 0) where the verifier tier was refused
    (security review 2026-11-27, ``t4``). Every tier now requires the same layers."""
    from dataclasses import replace as rep

    from sandbox.classify import classify_path
    from sandbox.features import probe

    require_sandbox()
    feats = probe()
    no_seccomp = rep(
        feats,
        usable={**feats.usable, "seccomp": False},
        why={**feats.why, "seccomp": "libseccomp missing (simulated)"},
    )
    path = tmp_path / "reward.py"
    path.write_text(SNEAKY)
    assert classify_path(path).tier == "function"  # the scan is evaded
    with RewardClient(path, "tenant-x", tier=explicit_tier, features=no_seccomp) as c:
        assert c.tier == "function"
        out = c.score([item("")])
        assert c._pool is None  # refused before any worker started
    assert out.status is OutcomeStatus.REFUSED and out.cause is Cause.PLATFORM_ERROR
    assert "refusing the function tier" in out.message and "seccomp" in out.message


def test_without_seccomp_the_same_unshare_would_succeed(tmp_path: Path) -> None:
    """Control for the test above: it is the filter, not something else, that denies."""
    with ungated_worker(tmp_path, PROBE, without=frozenset({"seccomp"})) as w:
        worker_ok(
            w,
            """
            import ctypes, ctypes.util
            libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
            assert 'Seccomp:\\t0' in open('/proc/self/status').read()
            assert libc.unshare(0x10000000) == 0, ctypes.get_errno()
            """,
        )


# -- filesystem -------------------------------------------------------------------------


def test_host_paths_project_tree_and_host_pid1_invisible(client: RewardClient) -> None:
    host_scratch_root = "/run/runwatch-sandbox"
    run_ok(
        client,
        f"""
        import os
        assert sorted(os.listdir('/')) == sorted(
            ['artifact', 'bin', 'dev', 'etc', 'lib', 'lib64', 'proc', 'runtime', 'sbin',
             'scratch', 'usr']
        ) or set(os.listdir('/')) <= {{'artifact', 'bin', 'dev', 'etc', 'lib', 'lib32', 'lib64',
             'proc', 'runtime', 'sbin', 'scratch', 'usr'}}, os.listdir('/')
        for p in ({REPO!r}, '/work', '/root', '/home', '/tmp', '/var', '/run', '/sys',
                  '/etc/passwd', '/etc/shadow', {host_scratch_root!r}):
            assert not os.path.exists(p), p
        assert os.listdir('/etc') == ['ld.so.cache'], os.listdir('/etc')
        # our own pid namespace, whose pid 1 is the worker itself (no bwrap init inside)
        assert os.getpid() == 1, os.getpid()
        cmd = open('/proc/1/cmdline', 'rb').read().split(b'\\0')
        assert cmd[:5] == [b'/usr/bin/python3', b'-I', b'-S', b'-B',
                           b'/runtime/worker_main.py'], cmd
        assert b'bwrap' not in b' '.join(cmd) and b'{{' not in b' '.join(cmd), cmd
        """,
    )


def test_writes_outside_scratch_fail(client: RewardClient) -> None:
    run_ok(
        client,
        """
        import errno
        for p in ('/x', '/usr/x', '/dev/x', '/dev/shm/x', '/artifact/x', '/runtime/x',
                  '/artifact/reward.py', '/etc/x', '/proc/x'):
            try:
                open(p, 'w').write('pwned')
                raise AssertionError(f'wrote {p}')
            except OSError as exc:
                assert exc.errno in (errno.EROFS, errno.EACCES, errno.ENOENT, errno.EPERM), exc
        open('/scratch/ok', 'w').write('fine')
        """,
    )


def test_scratch_is_destroyed_between_batches_function_tier(tmp_path: Path) -> None:
    """The function tier reuses its worker, yet scratch is empty at every batch."""
    require_sandbox()
    with make_client(tmp_path, PROBE, tier="function", recycle_every=10) as c:
        for _ in range(3):
            run_ok(
                c,
                """
                import os, subprocess
                assert os.listdir('/scratch') == [], os.listdir('/scratch')
                os.makedirs('/scratch/d/e')
                open('/scratch/d/e/f', 'w').write('x')
                os.symlink('/usr', '/scratch/link')
                """,
            )
        assert c._pool is not None and c._pool.spawned <= 2  # the worker was reused


def test_scratch_fresh_per_batch_verifier_tier(client: RewardClient) -> None:
    for _ in range(2):
        run_ok(
            client,
            """
            import os
            assert os.listdir('/scratch') == [], os.listdir('/scratch')
            open('/scratch/left-behind', 'w').write('x')
            """,
        )


def test_other_tenants_scratch_invisible(tmp_path: Path) -> None:
    require_sandbox()
    marker = "tenant-b-private-marker"
    with (
        make_client(tmp_path / "a", PROBE, tenant="tenant-iso-a", tier="function") as a,
        make_client(tmp_path / "b", PROBE, tenant="tenant-iso-b", tier="function") as b,
    ):
        # b leaves a file in its scratch; a walks everything it can see looking for it
        run_ok(b, f"open('/scratch/{marker}', 'w').write('secret')\nimport time")
        assert a._pool is not None and b._pool is not None
        wa, _ = a._pool.acquire()
        wb, _ = b._pool.acquire()
        assert wa is not None and wb is not None
        assert wa.uid != wb.uid and wa.scratch != wb.scratch  # never shared
        a._pool.release(wa, True)
        b._pool.release(wb, True)
        run_ok(
            a,
            f"""
            import os
            for root, dirs, files in os.walk('/', topdown=True):
                if root == '/' : dirs[:] = [d for d in dirs if d not in ('proc', 'usr')]
                assert {marker!r} not in files, root
            """,
        )


# -- resource contract ------------------------------------------------------------------


def test_rlimits_applied(client: RewardClient) -> None:
    lim = FAST_LIMITS
    run_ok(
        client,
        f"""
        import resource as r
        assert r.getrlimit(r.RLIMIT_AS) == ({lim.memory_bytes}, {lim.memory_bytes})
        assert r.getrlimit(r.RLIMIT_CPU) == ({lim.cpu_seconds}, {lim.cpu_seconds})
        assert r.getrlimit(r.RLIMIT_NOFILE) == ({lim.open_files}, {lim.open_files})
        assert r.getrlimit(r.RLIMIT_FSIZE) == ({lim.file_size_bytes}, {lim.file_size_bytes})
        assert r.getrlimit(r.RLIMIT_CORE) == (0, 0)
        try:
            r.setrlimit(r.RLIMIT_AS, (r.RLIM_INFINITY, r.RLIM_INFINITY))
            raise AssertionError('raised the hard limit back')
        except (ValueError, PermissionError):
            pass
        """,
    )


def test_file_size_limit(client: RewardClient) -> None:
    out = client.score([item("open('/scratch/big', 'wb').write(b'x' * (32 * 1024 * 1024))")])
    assert out.cause is Cause.TENANT_RESOURCE_EXCEEDED, out.message


FORK_BOMB = """
import os, time
children = []
while True:
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
"""


def sandbox_process_count() -> int:
    """Host processes running under any sandbox uid of this test process."""
    from sandbox.isolation import UIDS

    ours = UIDS.handed_out()
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid in ours:
                    n += 1
            except OSError:
                continue
    return n


def test_fork_bomb_dies_at_pids_cgroup_limit(client: RewardClient) -> None:
    out = client.score([item(FORK_BOMB)])
    assert out.status is not OutcomeStatus.OK
    assert out.cause is Cause.TENANT_RESOURCE_EXCEEDED, (out.cause, out.message)
    # the host is unaffected: it still answers, and nothing the bomb forked survived
    # (what remains under sandbox uids is the warm workers: 3 processes each at most)
    from sandbox.pool import REAPER

    REAPER.drain()
    limit = 3 * (client.config.warm_workers + 1)
    deadline = time.monotonic() + 5.0  # killed children may linger as zombies briefly
    while sandbox_process_count() > limit and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_process_count() <= limit
    assert run_ok(client, "result = 2.0") == (2.0,)


def test_fork_bomb_dies_at_rlimit_nproc_without_cgroup(tmp_path: Path) -> None:
    """Fallback layer: no pids cgroup -> RLIMIT_NPROC under the worker's own uid."""
    require_sandbox()
    layers = frozenset(ALL_LAYERS) - {"cgroup_pids"}
    with make_client(tmp_path, PROBE, tier="verifier", layers=layers) as c:
        run_ok(
            c,
            f"""
            import resource as r
            assert r.getrlimit(r.RLIMIT_NPROC) == ({FAST_LIMITS.pids}, {FAST_LIMITS.pids})
            """,
        )
        out = c.score([item(FORK_BOMB)])
        assert out.cause is Cause.TENANT_RESOURCE_EXCEEDED, (out.cause, out.message)
        assert run_ok(c, "result = 3.0") == (3.0,)


def test_memory_hog_dies_at_its_cap(client: RewardClient) -> None:
    out = client.score([item("blocks = []\nwhile True: blocks.append(bytearray(16 << 20))")])
    assert out.cause is Cause.TENANT_RESOURCE_EXCEEDED, (out.cause, out.message)
    assert run_ok(client, "result = 4.0") == (4.0,)


def test_worker_tree_lives_in_its_pids_memory_and_cpu_cgroups(client: RewardClient) -> None:
    """Host-side view: every process of a worker sits in cgroups carrying its limits."""
    pool = client._pool
    assert pool is not None
    w, failure = pool.acquire()
    assert w is not None, failure
    try:
        assert {"pids", "memory", "cpu"} <= set(w.cgroups)
        pids, mem, cpu = w.cgroups["pids"], w.cgroups["memory"], w.cgroups["cpu"]
        assert (pids.path / "pids.max").read_text().strip() == str(FAST_LIMITS.pids)
        assert mem.read_int("memory.limit_in_bytes") == FAST_LIMITS.memory_bytes
        quota = cpu.read_int("cpu.cfs_quota_us") / cpu.read_int("cpu.cfs_period_us")
        assert quota == FAST_LIMITS.cpu_cores
        # bubblewrap's monitor (outside the sandbox) and the worker, the sandbox's pid 1
        assert len(pids.procs()) == 2 and pids.procs() == mem.procs() == cpu.procs()
    finally:
        pool.release(w, healthy=False)


def test_infinite_loop_dies_at_the_deadline(tmp_path: Path) -> None:
    require_sandbox()
    from dataclasses import replace

    limits = replace(FAST_LIMITS, deadline_s=1.0)
    with make_client(tmp_path, PROBE, tier="verifier", limits=limits) as c:
        t = time.monotonic()
        out = c.score([item("while True: pass")])
        assert out.cause is Cause.TENANT_TIMEOUT, (out.cause, out.message)
        assert 1.0 <= time.monotonic() - t < 4.0
        assert run_ok(c, "result = 5.0") == (5.0,)


def test_tenant_concurrency_cap(tmp_path: Path) -> None:
    """Cap 1: two concurrent batches of one tenant never overlap; another tenant's do.

    Judged on when tenant code really ran, not on the callers' wall clock (which also
    counts queueing and, on a loaded box, pool warm-up): each batch reports the monotonic
    clock (one clock for every pid namespace) when its code started and when it ended.
    """
    require_sandbox()
    from sandbox.pool import set_tenant_cap

    set_tenant_cap("tenant-cap", 1)
    set_tenant_cap("tenant-other", 2)
    ran: dict[str, list[tuple[float, float]]] = {"tenant-cap": [], "tenant-other": []}
    started = "import time\nresult = time.monotonic()"
    slept = "import time\ntime.sleep(1.0)\nresult = time.monotonic()"
    clients = [
        make_client(tmp_path / f"c{i}", PROBE, tenant=t, tier="function", warm_workers=2)
        for i, t in enumerate(["tenant-cap", "tenant-cap", "tenant-other", "tenant-other"])
    ]
    time.sleep(0.5)  # let the pools warm up

    def go(c: RewardClient) -> None:
        out = c.score([item(started), item(slept)])
        assert out.ok, out.message
        assert out.scores is not None
        ran[c.tenant_id].append((out.scores[0], out.scores[1]))

    try:
        threads = [threading.Thread(target=go, args=(c,)) for c in clients]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
    finally:
        for c in clients:
            c.close()
    assert len(ran["tenant-cap"]) == 2 and len(ran["tenant-other"]) == 2, ran

    def overlap(t: str) -> bool:
        (a0, a1), (b0, b1) = ran[t]
        return a0 < b1 and b0 < a1

    assert not overlap("tenant-cap"), f"capped tenant's batches overlapped: {ran}"
    assert overlap("tenant-other"), f"uncapped tenant's batches were serialized: {ran}"


def test_hostile_tier_refused_when_a_layer_is_missing(tmp_path: Path) -> None:
    from sandbox.features import probe_uncached

    features = probe_uncached(bwrap="/nonexistent/bwrap")
    assert not features.usable["net_ns"]
    assert "bubblewrap" in features.describe()
    path = tmp_path / "r.py"
    path.write_text(PROBE)
    with RewardClient(path, "tenant-x", tier="verifier", features=features) as c:
        out = c.score([item("result = 1.0")])
    assert out.status is OutcomeStatus.REFUSED
    assert out.cause is Cause.PLATFORM_ERROR
    assert "refusing the verifier tier" in out.message and "net_ns" in out.message
    assert out.scores is None


#: tenant code that clears the worker's parent-death signal (bwrap's --die-with-parent is
#: one on pid 1, the worker): its score says whether the prctl took
CLEAR_PDEATHSIG = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "result = 1.0 if libc.prctl(1, 0, 0, 0, 0) == 0 else 0.0\n"
)


@pytest.mark.parametrize("prompt", ["result = 1.0", CLEAR_PDEATHSIG], ids=["honest", "pdeathsig"])
def test_killed_host_leaves_nothing_running_and_leftovers_are_reaped(
    tmp_path: Path, prompt: str
) -> None:
    """SIGKILL the host process mid-life: bwrap's --die-with-parent takes the sandboxes
    down with it, and reap_stale() removes the scratch mounts, dirs and cgroups. Also when
    the tenant's code tried to clear the worker's parent-death signal (review, 2026-11-28:
    ``prctl(PR_SET_PDEATHSIG, 0)`` kept the sandbox running as init's child, 7.9 CPU-s in
    the 10 s after the host died; seccomp now refuses it)."""
    import signal
    import subprocess
    import sys

    from sandbox.features import CGROUP_PARENT, CGROUP_V1_ROOT
    from sandbox.isolation import base_dir, reap_stale

    require_sandbox()
    (tmp_path / "r.py").write_text(PROBE)
    code = (
        "import sys, time\n"
        "from sandbox.client import RewardClient\n"
        f"c = RewardClient({str(tmp_path / 'r.py')!r}, 'tenant-k', tier='function')\n"
        f"o = c.score([{{'prompt': {prompt!r}, 'completion': ''}}])\n"
        "assert o.ok, o.message\n"
        "print('ready', o.scores[0], flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None
    try:
        expected = b"ready 1.0" if prompt == "result = 1.0" else b"ready 0.0"  # refused
        assert proc.stdout.readline().strip() == expected
        mine = [e for e in os.listdir(base_dir()) if f"-{proc.pid}-" in e]
        assert mine, "the host process staged nothing?"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    cg = Path(CGROUP_V1_ROOT) / "pids" / CGROUP_PARENT
    groups = [d for d in cg.iterdir() if d.name.startswith(f"{proc.pid}-")]
    while time.monotonic() < deadline:
        if all(not (d / "cgroup.procs").read_text().strip() for d in groups):
            break
        time.sleep(0.05)
    assert all(not (d / "cgroup.procs").read_text().strip() for d in groups), "sandbox survived"
    assert reap_stale() >= 1
    assert not [e for e in os.listdir(base_dir()) if f"-{proc.pid}-" in e]
    assert not [d for d in cg.iterdir() if d.name.startswith(f"{proc.pid}-")]
