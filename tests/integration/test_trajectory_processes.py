"""The trajectory API as real server processes: kill -9 in mid-stream and restart (every
pushed group served exactly once), and two instances sharing one buffer on one broker."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 8,
    "max_token_len": 64,
    "checkpoint_dir": "/tmp",
    "save_checkpoint_interval": 10,
    "starting_step": 0,
    "num_steps": 1000,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``runwatch serve trajectories`` as a child process (same instance name on restart)."""

    def __init__(self, port: int, backend: list[str], instance: str, run_id: str, tmp: Path):
        self.port, self.backend, self.instance, self.run_id = port, backend, instance, run_id
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> Server:
        cmd = [
            sys.executable, "-m", "runwatch.cli.main", "serve", "trajectories",
            "--port", str(self.port), "--instance", self.instance, "--run-id", self.run_id,
            "--state-dir", str(self.tmp / f"state-{self.instance}"), "--snapshot-every-s", "0.3",
            *self.backend,
        ]  # fmt: skip
        with open(self.tmp / "err.log", "ab") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.tmp / "err.log").read_text()[-3000:]
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("server did not come up")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def groups(markers: range) -> list[dict[str, object]]:
    return [
        {"tokens": [[m, 1]] * 2, "masks": [[1, 1]] * 2, "scores": [float(m)] * 2} for m in markers
    ]


class Pusher(threading.Thread):
    """Pushes lists of 4 two-sequence groups until stopped; records which markers were
    acknowledged and which pushes failed (their groups may or may not be on the log)."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.acked: set[int] = set()
        self.uncertain: set[int] = set()
        self.halt = threading.Event()
        self.next = 0

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            i = 0
            while not self.halt.is_set():
                markers = range(self.next, self.next + 4)
                self.next += 4
                url = self.urls[i % len(self.urls)]
                i += 1
                try:
                    r = client.post(url + "/scored_data_list", json=groups(markers))
                    if r.status_code == 200:
                        self.acked.update(markers)
                        continue
                    self.uncertain.update(markers) if r.status_code >= 500 else None
                except httpx.HTTPError:
                    self.uncertain.update(markers)
                time.sleep(0.05)


def get_batch(client: httpx.Client, url: str) -> list[int] | None:
    r = client.get(url + "/batch")
    r.raise_for_status()
    batch = r.json()["batch"]
    if not batch:
        return None
    assert sum(len(g["tokens"]) for g in batch) == 8
    return [int(g["scores"][0]) for g in batch]


def drain(urls: list[str], served: Counter[int], want: set[int], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=10) as client:
        i = 0
        while not want <= set(served) and time.monotonic() < deadline:
            got = get_batch(client, urls[i % len(urls)])
            i += 1
            if got is None:
                time.sleep(0.05)
                continue
            served.update(got)


def run_kill9_scenario(backend: list[str], tmp_path: Path) -> None:
    server = Server(free_port(), backend, "api-a", f"crash-{uuid.uuid4().hex[:6]}", tmp_path)
    server.start()
    try:
        httpx.post(server.url + "/register", json=REGISTRATION).raise_for_status()
        pusher = Pusher([server.url])
        pusher.start()
        served: Counter[int] = Counter()
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 30
            while sum(served.values()) < 40 and time.monotonic() < deadline:
                got = get_batch(client, server.url)
                served.update(got or [])
        assert served, "nothing served before the crash"
        time.sleep(0.5)  # let a snapshot land
        server.kill9()  # pushes in flight; no /batch in flight
        time.sleep(0.3)
        server.start()
        health = httpx.get(server.url + "/health").json()
        assert health["resumed_from"], health  # restarted from its snapshot, not from 0
        time.sleep(1.0)  # more pushes after the restart
        pusher.halt.set()
        pusher.join(20)
        drain([server.url], served, pusher.acked)
    finally:
        server.stop()
    twice = {m: n for m, n in served.items() if n > 1}
    assert not twice, f"served more than once: {twice}"
    missing = pusher.acked - set(served)
    assert not missing, f"acknowledged but never served: {sorted(missing)[:20]}"
    # pushes cut by the kill may or may not have landed; nothing else may appear
    assert set(served) <= pusher.acked | pusher.uncertain


@pytest.mark.slow
def test_kill9_mid_stream_embedded(tmp_path: Path) -> None:
    run_kill9_scenario(["--log", str(tmp_path / "log")], tmp_path)


@pytest.mark.slow
@pytest.mark.kafka
def test_kill9_mid_stream_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    run_kill9_scenario(["--kafka", kafka_bootstrap], tmp_path)


@pytest.mark.slow
@pytest.mark.kafka
def test_two_instances_share_one_buffer(kafka_bootstrap: str, tmp_path: Path) -> None:
    run_id = f"shared-{uuid.uuid4().hex[:6]}"
    a = Server(free_port(), ["--kafka", kafka_bootstrap], "api-a", run_id, tmp_path).start()
    b = Server(free_port(), ["--kafka", kafka_bootstrap], "api-b", run_id, tmp_path).start()
    try:
        httpx.post(a.url + "/register", json=REGISTRATION).raise_for_status()
        httpx.get(b.url + "/batch").raise_for_status()  # starts the trainer, via b
        env = httpx.post(b.url + "/register-env", json={
            "max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 2,
        }).json()  # fmt: skip
        assert env["env_id"] == 0 and env["status"] == "success"
        info = httpx.get(a.url + "/info").json()
        assert info == {"batch_size": 8, "max_token_len": 64}  # registered on a, seen on b
        pusher = Pusher([a.url, b.url])
        pusher.start()
        served: Counter[int] = Counter()
        time.sleep(1.5)
        pusher.halt.set()
        pusher.join(20)
        assert not pusher.uncertain
        drain([a.url, b.url], served, pusher.acked)  # trainers alternate between instances
        twice = {m: n for m, n in served.items() if n > 1}
        assert not twice, f"served more than once: {twice}"
        assert set(served) == pusher.acked
        time.sleep(0.5)
        sa, sb = httpx.get(a.url + "/status").json(), httpx.get(b.url + "/status").json()
        assert sa == sb and sa["current_step"] == len(pusher.acked) // 4
    finally:
        a.stop()
        b.stop()
