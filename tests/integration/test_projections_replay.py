"""Projection engine on a real embedded log and a real SQLite file: replay, resume,
idempotence, interleaving independence, dead letters, audit verify."""

from __future__ import annotations

import random
import sqlite3

import pytest

from events import encode
from events.log.embedded import EmbeddedLog
from projections.sqlite_store import SqliteReadModel
from projections.store import InMemoryReadModel
from runwatch.hosting.audit import first_difference, verify
from runwatch.hosting.read_model import INPUTS, read_model_host
from runwatch.hosting.replay import rebuild_from_log, replay_log
from tests.projection_runs import synth_fleet, synth_run, write_log


@pytest.fixture
def fleet_events():
    return synth_fleet(14, 60)


@pytest.fixture
def log_dir(tmp_path, fleet_events):
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    write_log(log, fleet_events)
    return tmp_path / "log"


def per_run(derived):
    """Each fold's derived events per run, in order (two folds' outputs may interleave
    differently; each fold's own sequence per run must not)."""
    out: dict[tuple[str, str], list[bytes]] = {}
    for ev in derived:
        out.setdefault((ev.run_id, ev.producer), []).append(encode(ev))
    return out


def test_replay_builds_every_run_with_one_terminal_state(log_dir):
    result = rebuild_from_log(log_dir)
    views = result.store.all_views()
    assert len(views) == 14
    for v in views:
        assert v.state in ("SUCCEEDED", "FAILED", "CANCELLED")
        if v.state == "FAILED":
            assert v.attribution["failure_class"] == v.failure_class
        assert v.usage["committed_steps"] > 0 and v.usage["spend_usd"] > 0
    s = result.summary()
    assert s["derived"]["RunStateChanged"] > 14 and s["held_at_terminal_barrier"] == 0


def test_sqlite_and_memory_models_agree_and_replay_is_idempotent(log_dir, tmp_path):
    mem = rebuild_from_log(log_dir)
    db = SqliteReadModel(tmp_path / "p.sqlite")
    rebuild_from_log(log_dir, db, commit_every=997)
    assert first_difference(mem.store.export(), db.export()) is None
    again = rebuild_from_log(log_dir, SqliteReadModel(tmp_path / "p.sqlite"))
    assert again.host.view.applied == 0 and again.derived == []  # every record already applied
    assert first_difference(mem.store.export(), db.export()) is None


def test_crash_mid_replay_resumes_from_the_stored_offsets(log_dir, tmp_path):
    full = rebuild_from_log(log_dir)
    path = tmp_path / "crash.sqlite"
    log = EmbeddedLog(log_dir, readonly=True)
    records = list(log.iter_records(list(INPUTS)))
    engine = read_model_host(SqliteReadModel(path))
    derived = engine.process(records[:3000])
    engine.checkpoint()
    engine.process(records[3000:4500])  # applied in memory, never committed: the crash
    del engine
    resumed = rebuild_from_log(log_dir, SqliteReadModel(path))
    assert resumed.host.skipped == 0  # it started exactly at the committed positions
    derived += resumed.derived
    assert per_run(derived) == per_run(full.derived)
    assert first_difference(full.store.export(), SqliteReadModel(path).export()) is None


def test_output_does_not_depend_on_how_topics_interleave(tmp_path, fleet_events):
    """Same facts, five append orders: time-merged, grouped by topic, lifecycle last or
    first, random per-topic merge."""
    by_topic: dict[str, list] = {}
    for ev in fleet_events:
        by_topic.setdefault(type(ev).TOPIC, []).append(ev)
    rng = random.Random(3)
    shuffled, queues = [], {t: list(q) for t, q in by_topic.items()}
    while any(queues.values()):
        t = rng.choice([t for t, q in queues.items() if q])
        k = rng.randint(1, 40)
        shuffled.extend(queues[t][:k])
        del queues[t][:k]
    orders = {
        "time": fleet_events,
        "grouped": [e for t in sorted(by_topic) for e in by_topic[t]],
        "lifecycle_last": [
            e
            for t in sorted(by_topic, key=lambda t: t == "runwatch.lifecycle")
            for e in by_topic[t]
        ],
        # the trainer's RunPaused (answering an alert's pause request) read before the
        # alert: the barrier holds it until the alerts have passed it
        "lifecycle_first": [
            e
            for t in sorted(by_topic, key=lambda t: t != "runwatch.lifecycle")
            for e in by_topic[t]
        ],
        "random": shuffled,
    }
    results = {}
    for name, order in orders.items():
        assert sorted(e.event_id for e in order) == sorted(e.event_id for e in fleet_events)
        log = EmbeddedLog(tmp_path / name, sync=False)
        log.open_sync()
        write_log(log, order)
        results[name] = rebuild_from_log(tmp_path / name)
    base = results["time"]
    for name, r in results.items():
        assert per_run(r.derived) == per_run(base.derived), name
        exp, got = base.store.export(), r.store.export()
        assert first_difference(exp, got) is None, (name, first_difference(exp, got))


def test_bad_records_become_dead_letters_and_nothing_else_is_lost(tmp_path):
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    events = synth_run("r1", "acme", "healthy", steps=10)
    write_log(log, events[:20])
    bad = [
        log.append_sync("runwatch.telemetry", b"r1", b"{not json").offset,
        log.append_sync(
            "runwatch.telemetry", b"r1", b'{"type": "TrainerStepCompleted", "run_id": "r1"}'
        ).offset,
    ]
    write_log(log, events[20:])
    for result in (rebuild_from_log(tmp_path / "log"), replay_log(tmp_path / "log", workers=2)):
        assert len(result.host.dead_letters) == 2
        kinds = {d.kind for d in result.host.dead_letters}
        assert kinds == {"malformed_json", "validation_error"}
        assert sorted(d.source_offset for d in result.host.dead_letters) == bad
        assert result.store.get_run("r1").state == "SUCCEEDED"
        assert result.store.fleet().dead_letters == 2


def test_a_run_id_claimed_by_another_tenant_is_never_merged(tmp_path):
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    write_log(log, synth_run("shared", "acme", "healthy", steps=5))
    write_log(log, synth_run("shared", "evil", "platform", steps=4, t0=1.8e9))
    result = rebuild_from_log(tmp_path / "log")
    view = result.store.get_run("shared")
    assert view.tenant_id == "acme" and view.state == "SUCCEEDED"
    assert result.host.view.rejected_foreign > 0


def test_audit_verify_finds_no_difference_then_the_first_tampered_one(log_dir, tmp_path):
    path = tmp_path / "live.sqlite"
    rebuild_from_log(log_dir, SqliteReadModel(path), commit_every=500)
    ok = verify(SqliteReadModel(path), log_dir)
    assert ok.identical, ok.difference
    con = sqlite3.connect(path)
    con.execute(
        'UPDATE runs SET doc = replace(doc, \'"state": "SUCCEEDED"\', \'"state": "FAILED"\')'
        " WHERE run_id = 'run-0000'"
    )
    con.commit()
    bad = verify(SqliteReadModel(path), log_dir)
    assert not bad.identical
    path_, live, replayed = bad.difference
    assert path_ == "$.runs.run-0000.state" and (live, replayed) == ("FAILED", "SUCCEEDED")


def test_verify_compares_only_up_to_the_live_positions(log_dir, tmp_path):
    path = tmp_path / "behind.sqlite"
    log = EmbeddedLog(log_dir, readonly=True)
    records = list(log.iter_records(list(INPUTS)))
    engine = read_model_host(SqliteReadModel(path))
    engine.process(records[:2000])
    engine.checkpoint()
    result = verify(SqliteReadModel(path), log_dir)
    assert result.identical, result.difference
    assert result.replay.records == 2000


def test_memory_store_round_trips_engine_state():
    store = InMemoryReadModel()
    engine = read_model_host(store)
    events = synth_run("r", "t", "kl_gate", steps=30)
    engine.process_events((type(e).TOPIC, 0, e) for e in events[:100])
    engine.checkpoint()
    again = read_model_host(store)
    for fold in ("run_state", "accounting"):
        assert again.states(fold) == engine.states(fold)


def test_sharded_replay_builds_the_same_read_model(log_dir, tmp_path):
    single = rebuild_from_log(log_dir, SqliteReadModel(tmp_path / "one.sqlite"))
    sharded = replay_log(log_dir, store_path=tmp_path / "sharded.sqlite", workers=3)
    assert sharded.host.view.applied == single.host.view.applied
    store = SqliteReadModel(tmp_path / "sharded.sqlite")
    assert first_difference(single.store.export(), store.export()) is None
    assert store.positions() == single.store.positions()
    assert per_run(sharded.derived) == per_run(single.derived)
    again = rebuild_from_log(log_dir, store)  # the merged store resumes like any other
    assert again.host.view.applied == 0
    with pytest.raises(ValueError, match="already holds"):
        replay_log(log_dir, store_path=tmp_path / "sharded.sqlite", workers=2)


def test_sharded_in_memory_replay_equals_the_single_process_one(log_dir):
    single = rebuild_from_log(log_dir)
    for workers in (1, 2, 3):
        sharded = replay_log(log_dir, workers=workers)
        assert first_difference(single.store.export(), sharded.store.export()) is None
        assert sharded.store.positions() == single.store.positions()
        assert sharded.summary()["runs_by_state"] == single.summary()["runs_by_state"]
        assert sharded.records == single.records
        assert per_run(sharded.derived) == per_run(single.derived)
        assert sorted(e.event_id for e in sharded.derived) == sorted(
            e.event_id for e in single.derived
        )
        # the rebuilt engine holds the folds' states, so it could go on consuming
        assert sharded.host.states("run_state") == single.host.states("run_state")
        assert sharded.host.states("accounting") == single.host.states("accounting")


def test_sharded_replay_stops_where_it_is_told(log_dir):
    until = {f"{t}:0": 40 for t in INPUTS}
    single = rebuild_from_log(log_dir, until=until)
    sharded = replay_log(log_dir, workers=2, until=until)
    assert first_difference(single.store.export(), sharded.store.export()) is None
    log = EmbeddedLog(log_dir, readonly=True)
    expected = sum(min(40, log.end_offset_sync(t)) for t in INPUTS)
    assert sharded.records == single.records == expected


async def test_live_follower_restarts_from_its_store_and_matches_the_replay(tmp_path, fleet_events):
    """The follower over the embedded log (as `runwatch serve api` runs it), stopped
    half-way and restarted on the same SQLite store, ends equal to a from-scratch replay."""
    import asyncio

    from runwatch.hosting.follow import follow

    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    store_path = tmp_path / "live.sqlite"
    half = len(fleet_events) // 2
    live_derived = []

    async def run_until_caught_up(total: int) -> None:
        engine = read_model_host(SqliteReadModel(store_path))
        stop = asyncio.Event()
        task = asyncio.create_task(
            follow(
                log,
                engine,
                stop,
                group_id="g",
                settle_s=0.2,
                on_batch=lambda n, d: live_derived.extend(d),
            )
        )
        for _ in range(400):
            if sum(SqliteReadModel(store_path).positions().values()) >= total and not engine.held:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.4)  # let the settle release anything still held
        stop.set()
        await asyncio.wait_for(task, 10)

    write_log(log, fleet_events[:half])
    await run_until_caught_up(half)
    write_log(log, fleet_events[half:])
    await run_until_caught_up(len(fleet_events))
    replay = rebuild_from_log(tmp_path / "log")
    assert first_difference(replay.store.export(), SqliteReadModel(store_path).export()) is None
    assert per_run(live_derived) == per_run(replay.derived)


def _other_shard_run(run_id: str, prefix: str) -> str:
    from runwatch.hosting.shards import shard_of

    return next(
        f"{prefix}{i}"
        for i in range(1000)
        if shard_of(f"{prefix}{i}".encode(), 2) != shard_of(run_id.encode(), 2)
    )


def test_sharded_replay_releases_held_terminals_where_one_process_does(tmp_path):
    """Another shard's runs move the barrier topics' (global) watermarks past run A's end,
    so one process releases A's terminal; a late alert of A (stamped before its end)
    arrives afterwards. Every worker must see the same watermarks, or it folds the late
    alert before the terminal and A ends differently."""
    from tests.projection_runs import RunFactory

    a = "run-a"
    b = _other_shard_run(a, "run-b")
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    run_a = synth_run(a, "acme", "healthy", steps=30, t0=1.7e9)
    end = run_a[-1].ts
    log.append_events_sync(run_a)
    log.append_events_sync(synth_run(b, "acme", "hacked", steps=60, t0=end + 10))
    log.append_events_sync([RunFactory(a, "acme", t0=end - 5).fired("kl_blowup", 29)])
    one = rebuild_from_log(tmp_path / "log")
    two = replay_log(tmp_path / "log", workers=2)
    assert one.store.get_run(a).state == "SUCCEEDED"
    assert first_difference(one.store.export(), two.store.export()) is None
    assert one.store.load().held == two.store.load().held  # the watermarks, kept for a resume
    live = SqliteReadModel(tmp_path / "live.sqlite")
    rebuild_from_log(tmp_path / "log", live)
    assert verify(live, tmp_path / "log", workers=2).identical


def test_sharded_replay_without_the_forced_release_keeps_every_held_run(tmp_path):
    """Runs whose ends no later record releases stay held when the replay does not force
    the release (a store a live follower resumes): each shard's held runs survive the
    merge, and resuming that store releases them exactly as one process does."""
    a = "run-a"
    b = _other_shard_run(a, "run-b")
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    log.append_events_sync(synth_run(a, "acme", "healthy", steps=20, t0=1.7e9))
    log.append_events_sync(synth_run(b, "acme", "hacked", steps=20, t0=1.7e9 + 3))
    one = replay_log(tmp_path / "log", force_release=False)
    held = one.store.load().held
    assert set(held["runs"]) == {a, b}  # both ends wait for the watermarks to pass them
    for store_path in (None, tmp_path / "sharded.sqlite"):
        two = replay_log(tmp_path / "log", store_path=store_path, workers=2, force_release=False)
        assert two.store.load().held == held
        assert first_difference(one.store.export(), two.store.export()) is None
    resumed = rebuild_from_log(tmp_path / "log", SqliteReadModel(tmp_path / "sharded.sqlite"))
    whole = rebuild_from_log(tmp_path / "log")
    assert [resumed.store.get_run(r).state for r in (a, b)] == ["SUCCEEDED", "FAILED"]
    assert first_difference(whole.store.export(), resumed.store.export()) is None


def test_sharded_replay_stops_at_a_corrupt_record_like_one_process(tmp_path):
    from pathlib import Path

    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    log.append_events_sync(synth_run("r1", "acme", "healthy", steps=20))
    seg = sorted(Path(tmp_path / "log" / "runwatch.telemetry").glob("*.seg"))[0]
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    one = rebuild_from_log(tmp_path / "log")
    for two in (
        replay_log(tmp_path / "log", workers=2),
        replay_log(tmp_path / "log", store_path=tmp_path / "s.sqlite", workers=2),
    ):
        assert two.store.positions() == one.store.positions()
        assert two.records == one.records


def test_sharded_replay_places_keyless_records_by_run_and_refuses_mismatched_keys(tmp_path):
    from runwatch.hosting.shards import shard_of

    run = next(f"r{i}" for i in range(100) if shard_of(f"r{i}".encode(), 2) == 1)
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    events = synth_run(run, "acme", "healthy", steps=3)
    log.append_events_sync(events[:-1])
    log.append_sync(type(events[-1]).TOPIC, None, encode(events[-1]))  # no key
    one = rebuild_from_log(tmp_path / "log")
    two = replay_log(tmp_path / "log", workers=2)
    assert two.store.get_run(run).state == one.store.get_run(run).state == "SUCCEEDED"
    assert first_difference(one.store.export(), two.store.export()) is None
    other = _other_shard_run(run, "r")
    log.append_sync(type(events[-1]).TOPIC, other.encode(), encode(events[-1]))
    with pytest.raises(ValueError, match="keyed by their run id"):
        replay_log(tmp_path / "log", workers=2)


@pytest.mark.parametrize("seed", range(12))
def test_a_paused_and_resumed_run_reads_the_same_in_any_topic_order(tmp_path, seed):
    """The kl_gate run pauses (RunPaused held behind the barrier), resumes and ends: a
    queue that spans the pause and the end is released in event time, so the last reward
    facts are folded before RunCompleted whatever order the topics were read in."""
    events = synth_run("r-gate", "acme", "kl_gate", steps=25)
    by_topic: dict[str, list] = {}
    for ev in events:
        by_topic.setdefault(type(ev).TOPIC, []).append(ev)
    rng, queues, order = random.Random(seed), {t: list(q) for t, q in by_topic.items()}, []
    while any(queues.values()):
        t = rng.choice([t for t, q in queues.items() if q])
        k = rng.randint(1, 10)
        order.extend(queues[t][:k])
        del queues[t][:k]
    exports = []
    for name, evs in (("time", events), ("shuffled", order)):
        log = EmbeddedLog(tmp_path / name, sync=False)
        log.open_sync()
        write_log(log, evs)
        exports.append(rebuild_from_log(tmp_path / name).store.export())
    assert first_difference(*exports) is None
