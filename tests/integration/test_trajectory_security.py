"""Attacks on the trajectory API, performed for real against ``runwatch serve
trajectories`` processes over real sockets (issue 20, items 8-10), each asserting the
contained outcome: the status code, nothing stored on the log, the server's peak RSS.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from events.log.embedded import EmbeddedLog

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 4,
    "max_token_len": 64,
    "checkpoint_dir": "/tmp",
    "save_checkpoint_interval": 10,
    "starting_step": 0,
    "num_steps": 100,
}
ENV = {"max_token_length": 64, "desired_name": "math", "weight": 1.0, "group_size": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group(marker: float, size: int = 2, **extra: object) -> dict[str, object]:
    rows = {"tokens": [[1, 2, 3]] * size, "masks": [[-100, 2, 3]] * size}
    return {**rows, "scores": [marker] * size, **extra}


class Server:
    """``runwatch serve trajectories`` as a child process on the embedded log."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.tmp, self.args = tmp, args
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = tmp / "log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "runwatch.cli.main", "serve", "trajectories",
            "--port", str(self.port), "--log", str(self.log_dir), "--state-dir", "none",
            *self.args,
        ]  # fmt: skip

    def start(self) -> Server:
        with open(self.tmp / "server.log", "ab") as err:
            self.proc = subprocess.Popen(
                self.command(), cwd=ROOT, env=self.env, stdout=err, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server did not come up\n{self.output()}")

    def output(self) -> str:
        return (self.tmp / "server.log").read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logged(self, topic: str = "runwatch.trajectories") -> list[str]:
        """The types of the events on ``topic`` (payload records: their scores)."""
        log = EmbeddedLog(self.log_dir, readonly=True)
        values = [json.loads(r.value) for r in log.read_sync(topic)]
        return [v.get("type") or f"payload {v['scores']}" for v in values]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path, "--vocab-size", "1000").start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module, its trainer registered with batch_size 4, started."""
    s = Server(tmp_path_factory.mktemp("registered"), "--vocab-size", "1000").start()
    try:
        assert httpx.post(s.url + "/register", json=REGISTRATION).status_code == 200
        httpx.get(s.url + "/batch")
        yield s
    finally:
        s.stop()


# -- item 10: registrations and groups a trainer cannot use are refused -------------------


def test_bad_registrations_are_refused_and_nothing_is_stored(server: Server) -> None:
    with httpx.Client(base_url=server.url) as c:
        for bad in ({"batch_size": 0}, {"batch_size": -3}, {"max_token_len": 0}):
            r = c.post("/register", json={**REGISTRATION, **bad})
            assert r.status_code == 422, r.text
            (item,) = r.json()["detail"]
            assert (item["type"], item["loc"]) == ("greater_than_equal", ["body", *bad])
        assert c.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
        assert "TrajectoryTrainerRegistered" not in server.logged()

        assert c.post("/register", json=REGISTRATION).status_code == 200
        c.get("/batch")  # starts the trainer
        for bad in ({"group_size": 0}, {"weight": -1.0}, {"min_batch_allocation": 2.0}):
            r = c.post("/register-env", json={**ENV, **bad})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", *bad]
        assert server.logged().count("TrajectoryTrainerRegistered") == 1
        assert "TrajectoryEnvRegistered" not in server.logged()


@pytest.mark.parametrize(
    ("bad", "kind", "loc"),
    [
        ({"masks": [[-100, 2, 3]]}, "length_mismatch", ["masks"]),
        ({"scores": [1.0, 2.0, 3.0]}, "length_mismatch", ["scores"]),
        ({"masks": [[-100, 2, 3], [2, 3]]}, "length_mismatch", ["masks", 1]),
        ({"tokens": [[1, 2, 3], [1, 1000, 3]]}, "token_out_of_range", ["tokens", 1]),
        ({"tokens": [[1, -7, 3], [1, 2, 3]]}, "token_out_of_range", ["tokens", 0]),
        ({"masks": [[-100, 2, 3], [-1, 2, 3]]}, "token_out_of_range", ["masks", 1]),
        ({"env_id": -1}, "greater_than_equal", ["env_id"]),
        ({"tokens": [], "masks": [], "scores": []}, "empty_group", ["tokens"]),
        (
            {"tokens": [[1]] * 5, "masks": [[1]] * 5, "scores": [0.0] * 5},
            "group_too_large",
            ["tokens"],
        ),
    ],
)
def test_groups_a_trainer_cannot_use_are_refused(
    registered: Server, bad: dict[str, object], kind: str, loc: list[object]
) -> None:
    """Each malformed group gets 422 with the reason (alone, and as the second of a list:
    the list is all or nothing), and nothing reaches the log."""
    before = registered.logged("runwatch.trajectory-payloads")
    with httpx.Client(base_url=registered.url) as c:
        r = c.post("/scored_data", json=group(1.0, **bad))
        assert r.status_code == 422, r.text
        assert [(d["type"], d["loc"]) for d in r.json()["detail"]] == [(kind, ["body", *loc])]
        r = c.post("/scored_data_list", json=[group(2.0), group(3.0, **bad)])
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", 1, *loc]
        assert registered.logged("runwatch.trajectory-payloads") == before
        # what is left is accepted, stored, and answered as received
        assert c.post("/scored_data", json=group(4.0)).json() == {"status": "received"}
        assert registered.logged("runwatch.trajectory-payloads") == [*before, "payload [4.0, 4.0]"]
        stored = registered.logged().count("ScoredDataGroupStored")
        assert stored == len(before) + 1
