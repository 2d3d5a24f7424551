"""Sandbox uids are unique host-wide (security review 2026-11-28: they were keyed by the
host pid modulo 1000, so two trainers could run two tenants under one uid and one could
spend the other's per-uid kernel budgets: pipe pages, POSIX mqueue bytes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[3])
N = 24

#: One allocator process: its scan starts where the other's does (as two trainers whose
#: pids agree modulo 1000), it takes N uids, prints them and holds them until stdin closes.
HOLDER = f"""
import sys
from sandbox.isolation import UID_BASE, UidAllocator
a = UidAllocator()
a._base = UID_BASE + 977 * 256
uids = [a.acquire() for _ in range({N})]
print(" ".join(map(str, uids)), flush=True)
sys.stdin.read()
"""


def _holder() -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _uids(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return [int(x) for x in line.split()]


@pytest.mark.timeout(60)
def test_two_processes_never_hand_out_the_same_uid() -> None:
    if os.geteuid() != 0:
        pytest.skip("sandbox uids are allocated only as root")
    a, b = _holder(), _holder()
    try:
        ua, ub = _uids(a), _uids(b)
        assert len(ua) == len(set(ua)) == N and len(ub) == len(set(ub)) == N
        assert None not in ua and None not in ub
        assert not set(ua) & set(ub), sorted(set(ua) & set(ub))
    finally:
        for p in (a, b):
            p.communicate("", timeout=30)
    # both processes are gone: the kernel dropped their locks, the uids are free again
    c = _holder()
    try:
        assert set(_uids(c)) & (set(ua) | set(ub))
    finally:
        c.communicate("", timeout=30)


def test_release_frees_the_uid_for_the_next_acquire(tmp_path: Path) -> None:
    from sandbox.isolation import UidAllocator

    first, second = UidAllocator(tmp_path), UidAllocator(tmp_path)
    second._base = first._base
    uid = first.acquire()
    assert uid is not None and second.acquire() != uid
    assert first.held() == {uid} and uid in first.handed_out()
    first.release(uid)
    assert first.held() == frozenset() and uid in first.handed_out()
    assert second.acquire() == uid
