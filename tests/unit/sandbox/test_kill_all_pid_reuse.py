"""``Cgroup.kill_all`` never kills a process that is not in the group (suspected by
review: a pid listed, exited and reused by a host process before ``kill(pid)``, would
have killed that host process). Each listed pid is pinned by a pidfd and signalled only
if the group still lists it once pinned. A real process stands in for the host's: the
group's listing names it once (stale), then no more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.isolation import Cgroup


class _Listing(Cgroup):
    """A group whose ``cgroup.procs`` answers from a script of listings."""

    def __init__(self, listings: list[set[int]]) -> None:
        super().__init__("pids", "test-kill-all")
        self.path = Path("/nonexistent")
        self.listings = listings

    def procs(self) -> set[int]:
        return self.listings.pop(0) if self.listings else set()


@pytest.fixture
def bystander():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_listed_then_gone_from_the_group_is_not_killed(bystander) -> None:  # type: ignore[no-untyped-def]
    group = _Listing([{bystander.pid}, set(), set()])  # listed once: its pid "reused"
    assert group.kill_all() is True
    assert bystander.poll() is None, "a process outside the group was killed"


def test_a_pid_the_group_still_lists_is_killed(bystander) -> None:  # type: ignore[no-untyped-def]
    group = _Listing([{bystander.pid}, {bystander.pid}, set()])
    assert group.kill_all() is True
    assert bystander.wait(10) == -9
