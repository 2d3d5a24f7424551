"""What a tenant could make the *host* spend, with the real sandbox (security review
2026-11-28): the trainer's memory on parsing the artifact, the host's disk through scratch,
per-uid kernel budgets shared with another tenant, and the host's write-back I/O."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox.client import FailurePolicy, RewardClient
from sandbox.isolation import base_dir
from sandbox.types import ALL_LAYERS, Cause, OutcomeStatus, SandboxConfig
from tests.integration.sandbox_support import (
    FAST_LIMITS,
    PROBE,
    item,
    make_client,
    require_sandbox,
    ungated_worker,
    write_reward,
)

pytestmark = pytest.mark.timeout(120)

REPO = str(Path(__file__).resolve().parents[2])
#: The trainer-side process may grow by this much at most while it takes an artifact in.
RSS_BOUND_MIB = 100
#: ``sandbox.classify.MAX_ARTIFACT_BYTES`` (checked by the unit tests)
MAX_ARTIFACT_BYTES = 1 << 20
HEAD = "def reward(batch):\n    return [1.0 for _ in batch]\n"

# -- 1. the artifact is bounded before anything is sandboxed --------------------------------

#: This process's peak RSS in MiB: ``VmHWM`` (kept by its memory map, which an ``exec``
#: replaces; ``ru_maxrss`` survives ``exec`` on Linux, so a child of a large pytest
#: process would report the parent's size).
PEAK_MIB = """
def peak_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
"""
#: A trainer: builds a RewardClient (no pre-spawn), scores once, prints what it got and its
#: own peak RSS (the parsing child's is not counted: another process).
TRAINER = (
    PEAK_MIB
    + """
import json, sys
from sandbox.client import RewardClient
c = RewardClient(sys.argv[1], "tenant-big", run_id="r", prewarm=False)
out = c.score([{"prompt": "p", "completion": "c"}])
c.close()
print(json.dumps({"status": out.status.value, "cause": out.cause.value, "tier": c.tier,
    "message": out.message, "rss_mib": peak_mib()}))
"""
)


def trainer(path: Path) -> dict[str, object]:
    """Run :data:`TRAINER` on ``path`` in a fresh process; its report."""
    proc = subprocess.run(
        [sys.executable, "-c", TRAINER, str(path)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def baseline_rss(tmp_path: Path) -> float:
    return float(trainer(write_reward(tmp_path / "ok", HEAD))["rss_mib"])  # type: ignore[arg-type]


def test_an_artifact_over_the_cap_is_refused_and_the_trainer_stays_small(
    tmp_path: Path,
) -> None:
    """A 2 MB list literal cost the trainer's process 968 MiB and 8 s in ``ast.parse``."""
    path = write_reward(tmp_path, HEAD + "x=[" + "1," * 1_000_000 + "]\n")
    got = trainer(path)
    assert got["status"] == "refused" and got["cause"] == "tenant_bad_artifact", got
    assert f"larger than {MAX_ARTIFACT_BYTES} bytes" in str(got["message"]), got
    assert float(got["rss_mib"]) < baseline_rss(tmp_path) + RSS_BOUND_MIB, got  # type: ignore[arg-type]


def test_an_artifact_under_the_cap_but_costly_to_parse_is_parsed_elsewhere(
    tmp_path: Path,
) -> None:
    """1 MiB of one-token statements: 933 MiB and 5.6 s to parse in-process. Parsed in a
    child under RLIMIT_AS / RLIMIT_CPU, which dies: the tenant's bad artifact."""
    path = write_reward(tmp_path, HEAD + "a\n" * (MAX_ARTIFACT_BYTES // 2 - 40))
    assert path.stat().st_size <= MAX_ARTIFACT_BYTES
    got = trainer(path)
    assert got["status"] == "refused" and got["cause"] == "tenant_bad_artifact", got
    assert "too complex to parse" in str(got["message"]), got
    assert float(got["rss_mib"]) < baseline_rss(tmp_path) + RSS_BOUND_MIB, got  # type: ignore[arg-type]


def test_ordinary_code_of_nearly_the_cap_still_classifies(tmp_path: Path) -> None:
    """No false refusal: ~1 MiB of ordinary code (the standard library's own modules)
    parses within the child's limits."""
    from sandbox.classify import classify_path

    src, parts = HEAD, sorted(Path(os.__file__).parent.glob("*.py"))
    for p in parts:
        body = textwrap.indent(p.read_text("utf-8", errors="replace"), "    ")
        chunk = "if False:\n" + body + "\n    pass\n"
        if len((src + chunk).encode()) > MAX_ARTIFACT_BYTES - 100:
            continue
        try:
            compile(chunk, str(p), "exec")
        except SyntaxError:
            continue
        src += chunk
    path = write_reward(tmp_path, src)
    assert path.stat().st_size > MAX_ARTIFACT_BYTES * 0.9
    c = classify_path(path)
    assert c.tier in ("function", "verifier"), c.reasons


CLI = (
    PEAK_MIB
    + """
import sys
from runwatch.cli.main import main
rc = main(["sandbox", *sys.argv[1:]])
print("RSS_MIB", peak_mib(), file=sys.stderr)
sys.exit(rc)
"""
)


def test_cli_check_and_score_refuse_an_artifact_over_the_cap(tmp_path: Path) -> None:
    path = write_reward(tmp_path, HEAD + "x=[" + "1," * 1_000_000 + "]\n")
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"prompt": "a", "completion": "b"}\n')
    for args in (
        ["check", str(path), "--json"],
        ["score", str(path), "--batch", str(batch), "--json"],
    ):
        proc = subprocess.run(
            [sys.executable, "-c", CLI, *args],
            capture_output=True,
            text=True,
            timeout=100,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        assert proc.returncode == 1, proc.stderr[-2000:]
        doc = json.loads(proc.stdout)
        rss = float(proc.stderr.rsplit("RSS_MIB", 1)[1])
        assert rss < 200, rss  # the whole CLI, imports included; was ~1 GiB
        if args[0] == "check":
            assert doc["kind"] == "invalid" and doc["passed"] is False
            assert any("larger than" in r for r in doc["reasons"]), doc
        else:
            assert doc["status"] == "refused", doc
            assert doc["ledger"]["cause"] == "tenant_bad_artifact", doc
            assert "larger than" in doc["ledger"]["message"], doc


# -- 2. scratch is bounded, and whatever a tenant builds in it is removed -------------------

DEEP = """
import os
CALLS = []
def reward(batch):
    CALLS.append(1)
    left = sorted(os.listdir('/scratch'))
    os.chdir('/scratch')
    for _ in range(1500):
        os.mkdir('d')
        os.chdir('d')
    open('f', 'wb').write(b'x' * 4096)
    os.chdir('/')
    return [float(len(CALLS)), float(len(left))]
"""


def test_a_deep_tree_in_scratch_is_emptied_and_the_worker_kept(tmp_path: Path) -> None:
    """A tree 1,500 deep made ``shutil.rmtree`` raise RecursionError between batches: the
    worker was retired every batch and, on a host without the tmpfs, its scratch leaked."""
    require_sandbox()
    with make_client(tmp_path, DEEP, tier="function") as c:
        for n in (1, 2, 3):
            out = c.score([item(""), item("")])
            assert out.status is OutcomeStatus.OK, f"{out.cause.value}: {out.message}"
            assert out.scores == (float(n), 0.0), out.scores  # same worker, empty scratch


def test_no_tier_runs_without_the_scratch_tmpfs(tmp_path: Path) -> None:
    """A plain host directory as scratch is bounded per file only (646 MB written to the
    host's disk in one batch, past a 256 MiB memory cap): no longer a fallback."""
    require_sandbox()
    layers = frozenset(ALL_LAYERS) - {"scratch_tmpfs"}
    for tier in ("function", "verifier"):
        cfg = SandboxConfig(limits=FAST_LIMITS, layers=layers)
        path = write_reward(tmp_path / tier, HEAD)
        with RewardClient(
            path, "tenant-x", tier=tier, policy=FailurePolicy("skip"), config=cfg
        ) as c:
            out = c.score([item("")])
            assert c._pool is None
        assert out.status is OutcomeStatus.REFUSED and out.cause is Cause.PLATFORM_ERROR
        assert "scratch_tmpfs" in out.message


def test_below_the_gate_a_plain_scratch_with_a_deep_tree_leaves_nothing(tmp_path: Path) -> None:
    """The control worker without the tmpfs (a plain directory): closed, nothing is left
    under the sandbox's base directory (it leaked for good, and ``reap_stale`` gave up)."""
    leftover = None
    try:
        with ungated_worker(tmp_path, DEEP, without=frozenset({"scratch_tmpfs"})) as w:
            res = w.score([item(""), item("")])
            assert res.ok, f"{res.cause.value}: {res.message}"
            leftover = base_dir() / f"w-{w.name}"
            assert leftover.is_dir()
        assert not leftover.exists()
    finally:  # never leave the tree behind, whatever the outcome (rm -rf is iterative)
        if leftover is not None:
            subprocess.run(["rm", "-rf", str(leftover)], check=False)


# -- 3. per-uid kernel budgets: closed inside the worker ------------------------------------

BUDGETS = """
import ctypes, ctypes.util, errno, os, resource as r, signal
assert r.getrlimit(r.RLIMIT_MSGQUEUE) == (0, 0), r.getrlimit(r.RLIMIT_MSGQUEUE)
assert r.getrlimit(r.RLIMIT_SIGPENDING) == (64, 64), r.getrlimit(r.RLIMIT_SIGPENDING)
assert r.getrlimit(r.RLIMIT_RTPRIO) == (0, 0)
libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
fd = libc.mq_open(b'/rw-test', os.O_CREAT | os.O_RDWR, 0o600, None)
assert fd == -1 and ctypes.get_errno() == errno.EMFILE, (fd, ctypes.get_errno())
sig = signal.SIGRTMIN + 1
signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
queued = 0
while queued < 10000 and libc.sigqueue(os.getpid(), sig, ctypes.c_void_p(0)) == 0:
    queued += 1
assert ctypes.get_errno() == errno.EAGAIN and queued <= 64, (queued, ctypes.get_errno())
"""


def test_per_uid_kernel_budgets_are_closed_inside_the_worker(tmp_path: Path) -> None:
    """A uid's POSIX mqueue bytes and pending signals are one budget for all its
    processes; the worker's limits take them off the table (and its uid is its own)."""
    require_sandbox()
    with make_client(tmp_path, PROBE, tier="verifier") as c:
        out = c.score([item(BUDGETS)])
        assert out.status is OutcomeStatus.OK, f"{out.cause.value}: {out.message}"


# -- 4. sync(2) and syncfs(2) write back nothing of the host's ------------------------------

SYNC = """
import ctypes, ctypes.util, glob, os
libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
os.sync()
fd = os.open(sorted(glob.glob('/usr/lib/python3*/os.py'))[0], os.O_RDONLY)
assert libc.syncfs(fd) == 0, ctypes.get_errno()  # looks like it worked: a reward goes on
"""


def dirty_kib() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("Dirty:"):
                return int(line.split()[1])
    raise AssertionError("no Dirty: line")


def dirty_left_after(tmp_path: Path, run: object) -> float:
    """Write 128 MiB the host has not written back, call ``run``, and return the share
    of those dirty pages still dirty after it (write-back takes 30 s on its own)."""
    data = tmp_path / "dirty.bin"
    os.sync()
    before = dirty_kib()
    with open(data, "wb") as fh:
        for _ in range(128):
            fh.write(b"\xa5" * (1 << 20))
    written = dirty_kib() - before
    assert written > 100 * 1024, written
    run()  # type: ignore[operator]
    left = dirty_kib() - before
    data.unlink()
    return left / written


def test_sync_in_a_reward_leaves_the_hosts_dirty_pages(tmp_path: Path) -> None:
    """One ``os.sync()`` in a reward flushed 300 MB the host had written, I/O charged to
    no sandbox. ``sync`` and ``syncfs`` are now no-ops that return 0."""
    require_sandbox()
    with make_client(tmp_path / "c", PROBE, tier="verifier") as c:
        assert c.score([item("")]).ok  # warm
        share = dirty_left_after(tmp_path, lambda: c.score([item(SYNC)]))
        out = c.score([item(SYNC)])
        assert out.status is OutcomeStatus.OK, f"{out.cause.value}: {out.message}"
    assert share > 0.5, share


def test_without_seccomp_sync_in_a_reward_flushes_the_host(tmp_path: Path) -> None:
    """Control for the test above: the filter is what keeps the host's pages dirty."""
    with ungated_worker(tmp_path / "w", PROBE, without=frozenset({"seccomp"})) as w:
        assert w.score([item("")]).ok
        share = dirty_left_after(tmp_path, lambda: w.score([item(SYNC)]))
    assert share < 0.2, share
