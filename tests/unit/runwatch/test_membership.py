"""Static group membership of the faust worker: a slot per live worker, taken back by a
worker that replaces a killed one (the kernel drops a dead process's flock)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from runwatch.hosting import membership

ROOT = Path(__file__).resolve().parents[3]


def test_live_workers_get_distinct_slots(tmp_path: Path) -> None:
    assert membership.instance_id("app", tmp_path, host="h") == "h-0"
    assert membership.instance_id("app", tmp_path, host="h") == "h-1"  # this one holds 0
    assert membership.instance_id("other", tmp_path, host="h") == "h-0"  # per app


def test_a_killed_workers_slot_is_taken_back(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from runwatch.hosting import membership;"
         f"print(membership.instance_id('app', Path({str(tmp_path)!r}), host='h'), flush=True);"
         "time.sleep(60)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "h-0"
    assert membership.instance_id("app", tmp_path, host="h") == "h-1"  # 0 is held
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(0.1)
    assert membership.instance_id("app", tmp_path, host="h") == "h-0"  # freed by the kill


def test_group_settings() -> None:
    s = membership.group_settings("h-0")
    assert s["consumer_group_instance_id"] == "h-0" and s["broker_session_timeout"] == 10.0
    assert s["broker_heartbeat_interval"] <= s["broker_session_timeout"] / 3
    assert membership.group_settings("")["consumer_group_instance_id"] is None  # dynamic
    assert membership.group_settings(None, 60)["broker_rebalance_timeout"] == 60
