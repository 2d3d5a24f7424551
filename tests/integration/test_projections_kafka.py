"""On the real broker: the live follower and a from-scratch replay of the same topics
yield identical projections and identical derived events.

The producer deliberately skews the topics (lifecycle and telemetry first, alerts and
rewards late and in bursts), so the live consumer sees a very different cross-topic
interleaving from the replay's timestamp merge. Tests share the session broker and its
registry topics, so this one only looks at its own runs (unique run ids).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pytest

from events import encode
from events.codec import decode
from events.log.kafka import KafkaLog
from projections.sqlite_store import SqliteReadModel
from runwatch.hosting.audit import first_difference
from runwatch.hosting.follow import follow
from runwatch.hosting.read_model import read_model_host
from runwatch.hosting.replay import rebuild_from_backend
from tests.projection_runs import SCENARIOS, synth_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def _by_run_and_fold(events, runs):
    out: dict[tuple[str, str], list[bytes]] = {}
    for ev in events:
        if ev.run_id in runs:
            out.setdefault((ev.run_id, ev.producer), []).append(encode(ev))
    return out


async def _append(backend: KafkaLog, events) -> None:
    by_topic: dict[str, list] = {}
    for ev in events:
        by_topic.setdefault(type(ev).TOPIC, []).append((ev.key(), encode(ev)))
    for topic, records in by_topic.items():
        await backend.append_many(topic, records)


async def test_live_and_replay_agree_on_the_real_broker(jvm_broker, tmp_path):
    # a broker of its own: live-vs-replay reads every run on the topics, and other tests'
    # processes (faust workers, trajectory servers) may still be appending to the shared one
    kafka_bootstrap = jvm_broker.bootstrap
    tag = uuid.uuid4().hex[:8]
    runs = {
        f"kt-{tag}-{i}": synth_run(
            f"kt-{tag}-{i}",
            f"tenant-{i % 3}",
            SCENARIOS[i % len(SCENARIOS)],
            steps=40,
            t0=1.7e9 + i,
        )
        for i in range(len(SCENARIOS) * 2)
    }
    events = sorted((e for evs in runs.values() for e in evs), key=lambda e: e.ts)
    early = [e for e in events if type(e).TOPIC in ("runwatch.lifecycle", "runwatch.telemetry")]
    late = [e for e in events if type(e).TOPIC not in ("runwatch.lifecycle", "runwatch.telemetry")]

    backend = KafkaLog(kafka_bootstrap, client_id=f"proj-{tag}")
    await backend.start()
    live_store = SqliteReadModel(tmp_path / "live.sqlite")  # the durable live projection
    engine = read_model_host(live_store)
    live_derived = []
    stop = asyncio.Event()
    follower = asyncio.create_task(
        follow(
            backend,
            engine,
            stop,
            group_id=f"proj-test-{tag}",
            publish_to=backend,
            settle_s=1.5,
            on_batch=lambda n, derived: live_derived.extend(derived),
        )
    )
    try:
        for i in range(0, len(early), 400):  # lifecycle + telemetry stream in first ...
            await _append(backend, early[i : i + 400])
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # well inside settle_s: the terminals stay held
        for i in range(0, len(late), 150):  # ... alerts, rewards, checkpoints arrive late
            await _append(backend, late[i : i + 150])
        for _ in range(240):
            views = [live_store.get_run(r) for r in runs]
            if (
                all(v and v.state in ("SUCCEEDED", "FAILED", "CANCELLED") for v in views)
                and not engine.held
            ):
                break
            await asyncio.sleep(0.25)
        else:
            states = [(r, v and v.state) for r, v in zip(runs, views)]
            pytest.fail(f"live projection did not settle: {states}")
    finally:
        stop.set()
        await asyncio.wait_for(follower, 30)

    replay = await rebuild_from_backend(backend)
    try:
        for run_id in runs:
            live_view, replayed = live_store.get_run(run_id), replay.store.get_run(run_id)
            assert first_difference(live_view.to_doc(), replayed.to_doc()) is None, run_id
            assert live_store.all_series(run_id) == replay.store.all_series(run_id)
        live = _by_run_and_fold(live_derived, runs)
        assert live == _by_run_and_fold(replay.derived, runs)
        # the read model derives run states; the bills are tenant accounting's, a stream
        # processor's (runwatch/folds.py), not the follower's
        assert {k[1] for k in live} == {"projections/run_state"}
        # what the follower published on the broker is exactly that, too
        published = []
        for topic in ("runwatch.run-states",):
            for p in await backend.partitions(topic):
                published += [decode(r.value) async for r in backend.read(topic, p)]
        by_id = {e.event_id: e for e in published if e.run_id in runs}
        assert {e.event_id for e in live_derived if e.run_id in runs} == set(by_id)
        # every run ends in exactly one terminal state, FAILED ones with exactly one class
        for run_id in runs:
            states = [e for e in live_derived if e.run_id == run_id and e.type == "RunStateChanged"]
            terminal = [e for e in states if e.to_state in ("SUCCEEDED", "FAILED", "CANCELLED")]
            assert len(terminal) == 1
            assert (terminal[0].failure_class is not None) == (terminal[0].to_state == "FAILED")
    finally:
        await backend.close()

    # the audit command: the whole durable projection (every run the follower saw, fleet
    # aggregates, tenant totals) against a from-scratch replay of the broker's topics
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "runwatch.cli.main",
            "audit",
            "verify",
            "--store",
            str(tmp_path / "live.sqlite"),
            "--kafka",
            kafka_bootstrap,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["identical"]


def test_serve_api_follows_kafka_and_audit_verify_agrees(jvm_broker, tmp_path):
    """`runwatch serve api --kafka` as a real process: it tails the broker into its own
    SQLite store and serves it; `runwatch audit verify --kafka` then finds no difference.
    On a broker of its own, for the reason given in the test above."""
    kafka_bootstrap = jvm_broker.bootstrap
    import socket
    import time

    import httpx
    import yaml

    tag = uuid.uuid4().hex[:8]
    events = sorted(
        (
            e
            for i in range(7)
            for e in synth_run(f"ks-{tag}-{i}", "acme", SCENARIOS[i], steps=25, t0=1.9e9 + i)
        ),
        key=lambda e: e.ts,
    )
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": "ops", "operator": True}]}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tmp_path / "served.sqlite"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runwatch.cli.main",
            "serve",
            "api",
            "--kafka",
            kafka_bootstrap,
            "--store",
            str(store),
            "--keys",
            str(keys),
            "--port",
            str(port),
            "--settle-s",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def produce() -> None:
            backend = KafkaLog(kafka_bootstrap, client_id=f"serve-{tag}")
            await backend.start()
            try:
                await _append(backend, events)
            finally:
                await backend.close()

        asyncio.run(produce())
        base, ops = f"http://127.0.0.1:{port}", {"Authorization": "Bearer ops"}
        deadline = time.monotonic() + 120
        states: dict[str, str | None] = {}
        while time.monotonic() < deadline:
            try:
                for i in range(7):
                    r = httpx.get(f"{base}/v1/operator/runs/ks-{tag}-{i}", headers=ops)
                    states[f"ks-{tag}-{i}"] = (
                        r.json()["run"]["state"] if r.status_code == 200 else None
                    )
            except httpx.HTTPError:
                pass
            if len(states) == 7 and all(
                s in ("SUCCEEDED", "FAILED", "CANCELLED") for s in states.values()
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"served projection did not settle: {states}")
    finally:
        proc.terminate()
        proc.wait(30)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "runwatch.cli.main",
            "audit",
            "verify",
            "--store",
            str(store),
            "--kafka",
            kafka_bootstrap,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["identical"]
