"""The trajectory API's contract, endpoint by endpoint, on the embedded log (in-process app,
real log files): shapes as the reference server answers them, errors, gzip both ways,
backpressure, staleness, exact batches, and a restart that loses nothing."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from events.log.embedded import EmbeddedLog
from runwatch.apps.trajectories import TrajectoryHost, TrajectorySettings
from runwatch.apps.trajectory_app import build_app

REGISTRATION = {
    "wandb_group": "grp",
    "wandb_project": "proj",
    "batch_size": 4,
    "max_token_len": 512,
    "checkpoint_dir": "/tmp/ckpt",
    "save_checkpoint_interval": 10,
    "starting_step": 0,
    "num_steps": 100,
}
ENV = {"max_token_length": 512, "desired_name": "math", "weight": 1.0, "group_size": 2}
FIELDS = [
    "tokens", "masks", "scores", "advantages", "ref_logprobs", "messages",
    "generation_params", "inference_logprobs", "overrides", "group_overrides", "images",
    "env_id", "distill_token_ids", "distill_logprobs",
]  # fmt: skip


def group(marker: float, size: int = 2, **extra: object) -> dict[str, object]:
    return {
        "tokens": [[1, 2, 3]] * size,
        "masks": [[-100, 2, 3]] * size,
        "scores": [marker] * size,
        **extra,
    }


def client_for(log_dir: Path, **settings: object) -> TestClient:
    config = TrajectorySettings(**{"instance": "test", **settings})  # type: ignore[arg-type]
    host = TrajectoryHost(EmbeddedLog(log_dir, sync=False), config)
    # (a loopback Host: without a token the API refuses other names, DNS rebinding)
    return TestClient(build_app(host), base_url="http://127.0.0.1")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        yield c


def wait_ready(c: TestClient) -> None:
    host = c.app.state.host  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not host.ready:
        assert time.monotonic() < deadline, "host never caught up"
        time.sleep(0.01)


def settle(c: TestClient) -> None:
    """Wait until the view folded everything appended so far."""
    host = c.app.state.host  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while host.backlog_groups() != len(
        host.view.queue
    ) or host.position < host.backend.end_offset_sync("runwatch.trajectories"):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def start_training(c: TestClient, **overrides: object) -> None:
    assert "uuid" in c.post("/register", json={**REGISTRATION, **overrides}).json()
    assert c.get("/batch").json() == {"batch": None}  # the first /batch starts the trainer


def test_root_and_info_before_registration(api: TestClient) -> None:
    assert api.get("/").json() == {"message": "AtroposLib API"}
    assert api.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert api.get("/wandb_info").json() == {"group": None, "project": None}
    assert api.get("/status").json() == {"current_step": 0, "queue_size": 0}
    assert api.get("/batch").json() == {
        "status": "error",
        "message": "Trainer not registered. Call /register first.",
        "batch": [],
    }
    assert api.get("/latest_example").json()["tokens"] == []


def test_registration_endpoints(api: TestClient) -> None:
    uuid_ = api.post("/register", json=REGISTRATION).json()["uuid"]
    assert isinstance(uuid_, int)
    settle(api)
    assert api.get("/info").json() == {"batch_size": 4, "max_token_len": 512}
    assert api.get("/wandb_info").json() == {"group": "grp", "project": "proj"}
    assert api.post("/register-env", json=ENV).json() == {"status": "wait for trainer to start"}
    api.get("/batch")
    first = api.post("/register-env", json=ENV).json()
    second = api.post("/register-env", json={**ENV, "weight": 3.0}).json()
    assert first == {
        "status": "success",
        "env_id": 0,
        "wandb_name": "math_0",
        "checkpoint_dir": "/tmp/ckpt",
        "starting_step": 0,
        "checkpoint_interval": 10,
        "num_steps": 100,
    }
    assert (second["env_id"], second["wandb_name"]) == (1, "math_1")
    status = api.request("GET", "/status-env", json={"env_id": 1}).json()  # body on a GET
    assert status["env_weight"] == pytest.approx(0.75)
    assert set(status) == {
        "current_step", "queue_size", "unallocated_fraction", "self_queue_size",
        "max_group_size", "env_weight",
    }  # fmt: skip
    assert api.get("/status-env", params={"env_id": 0}).json()["env_weight"] == pytest.approx(0.25)
    assert api.request("GET", "/status-env", json={"env": 1}).status_code == 422
    assert api.request("GET", "/status-env", json={"env_id": 9}).status_code == 404
    assert api.post("/disconnect-env", json={"env_id": 0}).json() == {"status": "success"}
    settle(api)
    assert api.get("/status-env", params={"env_id": 1}).json()["env_weight"] == 1.0
    assert api.post("/disconnect-env", json={"env_id": 7}).json()["status"] == "failure"
    assert api.post("/register", json={"wandb_group": "x"}).status_code == 422


def test_scored_data_round_trip_every_field(api: TestClient) -> None:
    start_training(api)
    full = group(
        1.0,
        advantages=[[0.5, 0.5, 0.5]] * 2,
        ref_logprobs=[[-1.0, -2.0, -3.0]] * 2,
        inference_logprobs=[[-1.5, -2.5, -3.5]] * 2,
        messages=[[{"role": "user", "content": "hi", "reward": None}]] * 2,
        generation_params={"temperature": 0.7},
        overrides=[{"temperature": 0.5}, {}],
        group_overrides={"tag": "x"},
        images=None,
        env_id=None,
    )
    assert api.post("/scored_data", json=full).json() == {"status": "received"}
    assert api.post("/scored_data_list", json=[group(2.0)]).json() == {
        "status": "received",
        "groups_processed": 1,
    }
    settle(api)
    assert api.get("/status").json() == {"current_step": 0, "queue_size": 2}
    latest = api.get("/latest_example").json()
    assert list(latest) == FIELDS and latest["scores"] == [2.0, 2.0]
    batch = api.get("/batch").json()["batch"]
    assert [b["scores"][0] for b in batch] == [1.0, 2.0]
    assert list(batch[0]) == FIELDS and list(batch[1]) == FIELDS
    assert batch[0]["messages"] == full["messages"]
    assert batch[0]["generation_params"] == {"temperature": 0.7}
    assert batch[1]["advantages"] is None and batch[1]["distill_logprobs"] is None
    assert api.get("/status").json() == {"current_step": 1, "queue_size": 0}


@pytest.mark.parametrize(
    "bad",
    [
        {"messages": [[{"content": "no role"}]] * 2},
        {"messages": [[{"role": "user"}]] * 2},
    ],
)
def test_messages_without_role_or_content_are_422(api: TestClient, bad: dict) -> None:
    r = api.post("/scored_data", json=group(1.0, **bad))
    assert r.status_code == 422
    assert "role" in json.dumps(r.json()["detail"])
    r = api.post("/scored_data_list", json=[group(1.0), group(2.0, **bad)])
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"][:2] == ["body", 1]
    settle(api)
    assert api.get("/status").json()["queue_size"] == 0  # nothing half-accepted


def test_malformed_bodies_are_422_with_fastapi_shape(api: TestClient) -> None:
    r = api.post("/scored_data", json={"masks": [[1]], "scores": [1.0]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "tokens"]
    assert r.json()["detail"][0]["type"] == "missing"
    r = api.post("/scored_data", json=group(1.0, tokens=[["a"]]))
    assert r.status_code == 422
    assert api.post("/scored_data", content=b"{not json").status_code == 422


def test_gzip_request_bodies_and_gzip_responses(api: TestClient) -> None:
    start_training(api, batch_size=64)
    row = list(range(512))
    big = [group(float(i), size=8, tokens=[row] * 8, masks=[row] * 8) for i in range(8)]
    body = gzip.compress(json.dumps(big).encode())
    r = api.post(
        "/scored_data_list",
        content=body,
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert r.json() == {"status": "received", "groups_processed": 8}
    bad = api.post("/scored_data", content=b"not gzip", headers={"Content-Encoding": "gzip"})
    assert (bad.status_code, bad.text) == (400, "Invalid gzip payload")
    settle(api)
    r = api.get("/batch", headers={"Accept-Encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip"
    assert [len(b["tokens"]) for b in r.json()["batch"]] == [8] * 8
    r = api.get("/latest_example", headers={"Accept-Encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip" and r.json()["tokens"][0][:3] == [0, 1, 2]
    small = api.get("/info", headers={"Accept-Encoding": "gzip"})
    assert small.headers.get("content-encoding") != "gzip"
    r = api.get("/batch", headers={"Accept-Encoding": "identity"})
    assert r.json() == {"batch": None} and "content-encoding" not in r.headers


def test_exact_batches_from_mixed_group_sizes(api: TestClient) -> None:
    start_training(api, batch_size=8)
    sizes = [4, 2, 2, 8, 1, 3, 4, 4, 4]  # 32 sequences: four batches of 8
    api.post("/scored_data_list", json=[group(float(i), size=s) for i, s in enumerate(sizes)])
    settle(api)
    served = []
    while batch := api.get("/batch").json()["batch"]:
        assert sum(len(g["tokens"]) for g in batch) == 8
        markers = [int(g["scores"][0]) for g in batch]
        assert markers == sorted(markers)
        served += markers
    assert sorted(served) == list(range(len(sizes)))


def test_group_too_large_is_reported_and_does_not_stall(api: TestClient) -> None:
    # pushed before the trainer registered: accepted, then rejected on the log when the
    # registration's batch_size arrives
    api.post("/scored_data_list", json=[group(0.0, size=8), group(1.0, size=4)])
    api.post("/register", json={**REGISTRATION, "batch_size": 4})
    settle(api)
    # once the batch_size is known, such a group is refused at the door (nothing stored)
    r = api.post("/scored_data_list", json=[group(2.0, size=4), group(3.0, size=5)])
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "group_too_large"
    settle(api)
    assert api.get("/status").json()["queue_size"] == 1
    assert [g["scores"][0] for g in api.get("/batch").json()["batch"]] == [1.0]
    host = api.app.state.host  # type: ignore[attr-defined]
    rejected = [
        json.loads(r.value)
        for r in host.backend.read_sync("runwatch.batches")
        if b"TrajectoryGroupRejected" in r.value
    ]
    assert [(r["num_sequences"], r["reason"]) for r in rejected] == [(8, "too_large")]


def test_queue_cap_answers_503_with_retry_after(tmp_path: Path) -> None:
    with client_for(tmp_path / "log", max_queue_groups=3) as c:
        wait_ready(c)
        start_training(c)
        assert c.post("/scored_data_list", json=[group(0.0), group(1.0)]).status_code == 200
        r = c.post("/scored_data_list", json=[group(2.0), group(3.0)])
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert c.post("/scored_data", json=group(2.0)).status_code == 200
        assert c.post("/scored_data", json=group(3.0)).status_code == 503
        settle(c)
        assert c.get("/status").json()["queue_size"] == 3  # the refused list added nothing
        c.get("/batch")
        settle(c)
        assert c.post("/scored_data", json=group(3.0)).status_code == 200


def test_stale_groups_dropped_per_env_bound(tmp_path: Path) -> None:
    with client_for(tmp_path / "log", max_off_policy_steps=1) as c:
        wait_ready(c)
        start_training(c, batch_size=2)
        patient = c.post("/register-env", json={**ENV, "max_off_policy_steps": 10}).json()
        c.post("/scored_data_list", json=[group(float(i)) for i in range(3)])
        c.post("/scored_data", json=group(9.0, env_id=patient["env_id"]))
        settle(c)
        c.get("/batch")
        c.get("/batch")  # step 2: groups accepted at step 0 are 2 steps old
        assert c.get("/batch").json()["batch"][0]["scores"][0] == 9.0  # patient env's group


def test_reset_data(api: TestClient) -> None:
    start_training(api)
    api.post("/scored_data", json=group(1.0))
    r = api.get("/reset_data")
    assert (r.status_code, r.text) == (200, "Reset successful")
    settle(api)
    assert api.get("/status").json() == {"current_step": 0, "queue_size": 0}
    assert api.get("/info").json() == {"batch_size": -1, "max_token_len": -1}


def test_restart_rebuilds_state_and_serves_nothing_twice(tmp_path: Path) -> None:
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        c.post("/scored_data_list", json=[group(float(i)) for i in range(5)])
        settle(c)
        first = [g["scores"][0] for g in c.get("/batch").json()["batch"]]
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        assert c.get("/status").json() == {"current_step": 1, "queue_size": 3}
        assert c.get("/info").json()["batch_size"] == 4
        second = [g["scores"][0] for g in c.get("/batch").json()["batch"]]
        assert c.get("/batch").json() == {"batch": None}
    assert first == [0.0, 1.0] and second == [2.0, 3.0]


def test_groups_of_another_size_than_the_env_are_buffered(api: TestClient) -> None:
    start_training(api, batch_size=4)
    env_id = api.post("/register-env", json={**ENV, "group_size": 4}).json()["env_id"]
    assert api.post("/scored_data", json=group(0.0, env_id=env_id)).json() == {
        "status": "buffered",
        "buffer_size": 2,
    }
    settle(api)
    assert api.get("/status").json()["queue_size"] == 0
    r = api.post("/scored_data_list", json=[group(1.0, env_id=env_id), group(2.0, size=4)])
    assert r.json() == {
        "status": "received",
        "groups_processed": 2,
        "buffered": 1,
        "last_buffer_size": 0,
    }
    settle(api)
    assert api.get("/status").json()["queue_size"] == 3
    assert [g["scores"][0] for g in api.get("/batch").json()["batch"]] == [0.0, 1.0]


def test_snapshot_restart_resumes_mid_log_with_payloads(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    with client_for(tmp_path / "log", state_dir=state, snapshot_every_records=1) as c:
        wait_ready(c)
        start_training(c)
        c.post("/scored_data_list", json=[group(float(i)) for i in range(6)])
        settle(c)
        assert [g["scores"][0] for g in c.get("/batch").json()["batch"]] == [0.0, 1.0]
        settle(c)
    with client_for(tmp_path / "log", state_dir=state) as c:
        wait_ready(c)
        host = c.app.state.host  # type: ignore[attr-defined]
        assert host.resumed_from and host.resumed_from > 5  # not a replay from 0
        assert c.get("/status").json() == {"current_step": 1, "queue_size": 4}
        assert [g["scores"][0] for g in c.get("/batch").json()["batch"]] == [2.0, 3.0]
        assert c.get("/latest_example").json()["scores"] == [5.0, 5.0]


def test_snapshot_of_another_log_is_ignored(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    with client_for(tmp_path / "log1", state_dir=state, snapshot_every_records=1) as c:
        wait_ready(c)
        start_training(c)
        c.post("/scored_data_list", json=[group(float(i)) for i in range(6)])
        settle(c)
    with client_for(tmp_path / "log2", state_dir=state) as c:  # a different, fresh log
        wait_ready(c)
        assert c.app.state.host.resumed_from is None  # type: ignore[attr-defined]
        assert c.get("/status").json() == {"current_step": 0, "queue_size": 0}
        assert c.get("/info").json()["batch_size"] == -1


def test_gzip_bomb_is_413_not_out_of_memory(tmp_path: Path) -> None:
    """(In-process, with a small cap; tests/integration/test_trajectory_security.py sends
    the real bomb to a real server and watches its RSS.)"""
    with client_for(tmp_path / "log", max_body_bytes=1 << 20) as c:
        wait_ready(c)
        bomb = gzip.compress(b"[" + b" " * (4 << 20) + b"]")
        r = c.post("/scored_data_list", content=bomb, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 413
        assert r.json() == {
            "detail": f"inflated request body exceeds {1 << 20} bytes; send smaller requests"
        }
        plain = c.post("/scored_data_list", content=b"[" + b" " * (2 << 20) + b"]")
        assert plain.status_code == 413
        # several gzip members in one body are read as one (as gzip.decompress does)
        two = gzip.compress(b"[") + gzip.compress(b"]")
        r = c.post("/scored_data_list", content=two, headers={"Content-Encoding": "gzip"})
        assert r.json()["groups_processed"] == 0
        cut = gzip.compress(b"[]")[:-4]  # the trailer missing
        r = c.post("/scored_data_list", content=cut, headers={"Content-Encoding": "gzip"})
        assert (r.status_code, r.text) == (400, "Invalid gzip payload")


def test_payloads_stay_off_the_ordered_partition(tmp_path: Path) -> None:
    """The run's partition carries small metadata events only; each group's bytes are one
    record of the payload topic, and an instance without them serves them from there."""
    row = list(range(2000))
    big = [group(float(i), tokens=[row] * 2, masks=[row] * 2) for i in range(4)]
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        assert c.post("/scored_data_list", json=big).status_code == 200
        settle(c)
        log: EmbeddedLog = c.app.state.host.backend  # type: ignore[attr-defined]
        ordered = list(log.read_sync("runwatch.trajectories"))
        payloads = list(log.read_sync("runwatch.trajectory-payloads"))
        assert max(len(r.value) for r in ordered) < 1024
        assert [json.loads(r.value)["scores"][0] for r in payloads] == [0.0, 1.0, 2.0, 3.0]
        assert all(list(json.loads(r.value)) == FIELDS for r in payloads)
    # another instance, no payload cache: the batch comes from the payload topic
    with client_for(tmp_path / "log", instance="other") as c:
        wait_ready(c)
        host = c.app.state.host  # type: ignore[attr-defined]
        assert len(host.view.payloads) == 0 and len(host.view.locations) == 4
        body = c.get("/batch").json()["batch"]
        assert [g["scores"][0] for g in body] == [0.0, 1.0]
        assert body[0]["tokens"] == [list(range(2000))] * 2
        # the next batch's payloads were read ahead of it; served all the same
        assert [g["scores"][0] for g in c.get("/batch").json()["batch"]] == [2.0, 3.0]
        assert c.get("/batch").json() == {"batch": None}
        assert c.get("/latest_example").json()["scores"] == [3.0, 3.0]


def test_groups_logged_inline_by_an_older_server_are_still_served(tmp_path: Path) -> None:
    """A log written before payloads moved off the partition (``ScoredDataGroupAccepted``
    with its payload inline) folds and serves as before."""
    from events.catalog.trajectory import ScoredDataGroupAccepted
    from events.codec import encode
    from events.envelope import new_envelope

    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    for i in range(2):
        payload = json.dumps({f: (group(float(i)).get(f)) for f in FIELDS})
        ev = ScoredDataGroupAccepted(
            **new_envelope(tenant_id="default", run_id="atropos", producer="old", seq=i),
            group_id=f"old-{i}",
            num_sequences=2,
            payload=payload,
        )
        log.append_sync("runwatch.trajectories", ev.key(), encode(ev))
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        assert [g["scores"][0] for g in c.get("/batch").json()["batch"]] == [0.0, 1.0]
        assert c.get("/latest_example").json()["scores"] == [1.0, 1.0]


def test_a_push_whose_payload_append_fails_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    """The payload cache is written on a thread while the log acknowledges; when the
    append fails (here: the log refuses it), the request fails and its cached copies are
    dropped once written, so no bytes without an event stay behind."""
    with client_for(tmp_path / "log") as c:
        wait_ready(c)
        start_training(c)
        host = c.app.state.host  # type: ignore[attr-defined]
        real = host.backend.append_many

        async def refuse(topic: str, records: object, **kw: object) -> object:
            if topic == "runwatch.trajectory-payloads":
                raise OSError("disk full")
            return await real(topic, records, **kw)

        host.backend.append_many = refuse
        with pytest.raises(OSError):
            c.post("/scored_data_list", json=[group(1.0), group(2.0)])
        host.backend.append_many = real
        deadline = time.monotonic() + 10
        while len(host.view.payloads):
            assert time.monotonic() < deadline, "cached copies of a failed push stayed"
            time.sleep(0.01)
        assert c.post("/scored_data_list", json=[group(3.0)]).json()["groups_processed"] == 1
        settle(c)
        assert len(host.view.payloads) == 1 and len(host.view.queue) == 1
