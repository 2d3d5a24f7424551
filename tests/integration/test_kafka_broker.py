"""The JVM broker tooling end to end: start/stop, and `runwatch kafka up|status|down`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.broker import jvm

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def test_jvm_broker_starts_ready_and_stops_cleanly() -> None:
    broker = jvm.JvmBroker().start()
    try:
        assert broker.is_running()
        assert jvm.metadata_broker_count("127.0.0.1", broker.port) == 1
        assert broker.saw_ready_line()
        assert (jvm.libs_dir() / "kafka_2.13-3.9.1.jar").exists()
    finally:
        broker.stop()
    assert not broker.is_running()
    assert not broker.data_dir.exists()  # a temporary data dir goes with the broker
    with pytest.raises(OSError):
        jvm.metadata_broker_count("127.0.0.1", broker.port, timeout_s=1.0)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["RUNWATCH_KAFKA_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", "kafka", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_cli_up_status_down(tmp_path: Path) -> None:
    home = tmp_path / "kafka-home"
    port = jvm.free_port()
    try:
        none = _cli(home, "status", "--json")
        assert none.returncode == 3 and json.loads(none.stdout) == {"running": False}

        up = _cli(home, "up", "--no-docker", "--port", str(port))
        assert up.returncode == 0, up.stderr
        assert f"export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{port}" in up.stdout

        again = _cli(home, "up", "--no-docker", "--json")  # finds the running one
        state = json.loads(again.stdout)
        assert state["started"] is False and state["bootstrap"] == f"127.0.0.1:{port}"

        status = _cli(home, "status", "--json")
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["running"] is True and info["brokers"] == 1 and info["source"] == "jvm"
        table = _cli(home, "status")
        assert "| running   | yes" in table.stdout

        down = _cli(home, "down", "--json")
        assert down.returncode == 0 and json.loads(down.stdout)["stopped"] is True
        assert _cli(home, "status").returncode == 3

        # data and address survive down/up
        up2 = _cli(home, "up", "--no-docker", "--json")
        assert json.loads(up2.stdout)["bootstrap"] == f"127.0.0.1:{port}"
    finally:
        wiped = _cli(home, "down", "--wipe", "--json")
    assert json.loads(wiped.stdout)["wiped"] is True
    assert not (home / "data").exists()
