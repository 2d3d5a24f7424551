"""Worker names carry their creator's pid namespace, and the reaper keeps to its own.

Security review, 2026-11-28 (second round, a suspicion): cgroups and scratch were named
``<pid>-<n>`` and a pid names a process only inside its pid namespace. Two trainers in
two containers sharing the host's cgroup hierarchy could both be pid 7: they would share
``runwatch-sandbox/7-0`` (one tenant's limits and CPU time booked to another), and either
one's ``reap_stale`` took the other's groups for a dead process's and killed them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.features import CGROUP_PARENT, CGROUP_V1_ROOT
from sandbox.isolation import base_dir, pid_namespace, reap_stale, worker_name

DEAD = 4_194_000  # above any pid this host hands out (pid_max is 4,194,304 at most)


def test_a_worker_name_is_pid_number_and_namespace() -> None:
    ns = os.stat("/proc/self/ns/pid").st_ino
    assert worker_name(3) == f"{os.getpid()}-3-{ns}" and pid_namespace() == str(ns)


def test_the_reaper_leaves_another_namespaces_leftovers_alone() -> None:
    parent = Path(CGROUP_V1_ROOT) / "pids" / CGROUP_PARENT
    if os.geteuid() != 0 or not (Path(CGROUP_V1_ROOT) / "pids").is_dir():
        pytest.skip("needs root and the cgroup v1 pids hierarchy")
    parent.mkdir(exist_ok=True)
    ours, theirs, old = (
        parent / f"{DEAD}-0-{pid_namespace()}",
        parent / f"{DEAD}-0-1",
        parent / f"{DEAD}-1",
    )
    scratch_theirs = base_dir() / f"w-{DEAD}-0-1"
    try:
        for group in (ours, theirs, old):
            group.mkdir()
        scratch_theirs.mkdir()
        reap_stale()
        assert not ours.exists() and not old.exists()  # a dead pid of ours (or an old name)
        assert theirs.exists() and scratch_theirs.exists()  # another namespace's: kept
    finally:
        for path in (ours, theirs, old, scratch_theirs):
            if path.exists():
                path.rmdir()
