"""The ingest gateway's judgement and its app (a real ASGI app over a real embedded log,
in process): a tenant's hook publishes only its own tenant's hook events and reads only
its own tenant's commands and lifecycle facts; what it may not publish is dead-lettered
with the reason, never appended where a run would see it.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from events import AlertFired, PauseRequested, TenantUsageUpdated, TrainerStepCompleted
from events.catalog.lifecycle import RunPaused, RunStarted
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC
from projections.keys import ApiKeys
from runwatch.apps.ingest_app import (
    KEY_SCAN_BUDGET,
    MAX_RECORDS,
    SKIP_COST,
    create_app,
    scan_cost,
)
from runwatch.apps.ingest_policy import HOOK_EVENTS, admit, readable
from tests.event_samples import sample

A, B, OPS = "key-of-a", "key-of-b", "key-of-ops"


def _hooked(cls: type[EventBase], tenant: str = "tenant-a", run: str = "run-1") -> EventBase:
    """A hook's event: its run id ``<tenant>:<run>`` (as a hook behind the gateway names it)."""
    ev = sample(cls, run_id=run if ":" in run else f"{tenant}:{run}")
    return ev.model_copy(update={"tenant_id": tenant, "producer": "hook/run-1/abc"})


def _admit(ev: EventBase, tenant: str = "tenant-a", topic: str | None = None) -> object:
    return admit(tenant, topic or type(ev).TOPIC, ev.key(), encode(ev))


def test_a_hooks_own_event_is_admitted_unchanged() -> None:
    ev = _hooked(TrainerStepCompleted)
    assert _admit(ev) == ev


@pytest.mark.parametrize(
    ("ev", "kind", "says"),
    [
        (_hooked(TrainerStepCompleted, tenant="tenant-b"), "foreign_tenant", "'tenant-b'"),
        (_hooked(AlertFired), "refused_at_ingest", "may not publish AlertFired"),
        (_hooked(TenantUsageUpdated), "refused_at_ingest", "may not publish TenantUsage"),
        (_hooked(PauseRequested), "refused_at_ingest", "may not publish PauseRequested"),
        (
            _hooked(TrainerStepCompleted).model_copy(update={"producer": "trainer/run-1"}),
            "refused_at_ingest",
            "not a hook's",
        ),
    ],
)
def test_what_a_hook_may_not_publish_is_a_dead_letter_with_the_reason(
    ev: EventBase, kind: str, says: str
) -> None:
    letter = _admit(ev)
    assert isinstance(letter, DeadLetter)
    assert letter.kind == kind and says in letter.reason, letter.reason
    assert letter.raw == encode(ev)  # nothing lost


def test_wrong_topic_wrong_key_and_bad_json_are_refused() -> None:
    ev = _hooked(TrainerStepCompleted)
    assert "belongs on runwatch.telemetry" in _admit(ev, topic="runwatch.lifecycle").reason  # type: ignore[attr-defined]
    letter = admit("tenant-a", "runwatch.telemetry", b"other-run", encode(ev))
    assert isinstance(letter, DeadLetter) and "keyed by its run id" in letter.reason
    letter = admit("tenant-a", "runwatch.telemetry", b"tenant-a:run-1", b"{not json")
    assert isinstance(letter, DeadLetter) and letter.kind == "malformed_json"


@pytest.mark.parametrize("run", ["run-1", "tenant-b:run-1", "tenant-a-run-1", "tenant-:x"])
def test_a_hooks_run_id_is_of_its_own_tenant(run: str) -> None:
    """Found by review: any run id was taken, and a run id is its first tenant's in every
    host, so two customers' ``exp-1`` were one run (the second's every event refused: its
    run unmonitored, unbilled, never paused) and a tenant who guessed another's next run
    name took it first. Behind the gateway a run is ``<tenant>:<name>``."""
    ev = _hooked(TrainerStepCompleted).model_copy(update={"run_id": run})
    letter = admit("tenant-a", "runwatch.telemetry", run.encode(), encode(ev))
    assert isinstance(letter, DeadLetter) and letter.kind == "refused_at_ingest"
    assert "tenant-a:<name>" in letter.reason and letter.raw == encode(ev)
    ok = ev.model_copy(update={"run_id": "tenant-a:" + run})
    assert admit("tenant-a", "runwatch.telemetry", ok.key(), encode(ok)) == ok


def test_a_tenant_id_with_the_separator_is_refused_in_the_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": A, "tenant": "acme:eu"}]}))
    with pytest.raises(ValueError, match="holds no ':'"):
        ApiKeys.load(keys)


def test_every_hook_event_type_is_a_registered_event() -> None:
    from events.envelope import event_classes

    assert set(event_classes()) >= HOOK_EVENTS


def test_a_hook_reads_only_its_own_tenants_records() -> None:
    assert readable("tenant-a", encode(_hooked(RunPaused)))
    assert not readable("tenant-a", encode(_hooked(RunPaused, tenant="tenant-b")))
    assert not readable("tenant-a", b"\xff garbage")


# -- the app, in process, over a real embedded log ------------------------------------------


@pytest.fixture
def gateway(tmp_path: Path) -> tuple[TestClient, Path]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"key": A, "tenant": "tenant-a"},
                    {"key": B, "tenant": "tenant-b"},
                    {"key": OPS, "operator": True},
                ]
            }
        )
    )
    log_dir = tmp_path / "log"
    app = create_app(lambda: EmbeddedLog(log_dir), ApiKeys.load(keys))
    with TestClient(app) as client:
        yield client, log_dir


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _body(*events: EventBase) -> dict[str, object]:
    return {"records": [{"key": e.run_id, "value": encode(e).decode()} for e in events]}


def _on_log(log_dir: Path, topic: str) -> list[object]:
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    if topic not in log.topic_names():
        return []
    return [
        decode(r.value) if topic != DEAD_LETTER_TOPIC else r.value for r in log.read_sync(topic, 0)
    ]


def test_the_app_appends_a_tenants_events_and_dead_letters_the_rest(
    gateway: tuple[TestClient, Path],
) -> None:
    client, log_dir = gateway
    own, forged = _hooked(RunStarted), _hooked(RunStarted, tenant="tenant-b", run="run-b")
    r = client.post("/v1/ingest/runwatch.lifecycle", json=_body(own, forged), headers=_h(A))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["appended"] == [0]  # no offsets: they would tell of others' writes
    assert answer["refused"] == [
        {"index": 1, "kind": "foreign_tenant", "reason": answer["refused"][0]["reason"]}
    ]
    assert _on_log(log_dir, "runwatch.lifecycle") == [own]
    letters = [DeadLetter.model_validate_json(v) for v in _on_log(log_dir, DEAD_LETTER_TOPIC)]
    assert [(d.kind, d.raw, d.source_topic) for d in letters] == [
        ("foreign_tenant", encode(forged), "runwatch.lifecycle")
    ]


def test_keys_decide_who_may_write_and_read(gateway: tuple[TestClient, Path]) -> None:
    client, _ = gateway
    body = _body(_hooked(RunStarted))
    assert client.post("/v1/ingest/runwatch.lifecycle", json=body).status_code == 401
    assert (
        client.post("/v1/ingest/runwatch.lifecycle", json=body, headers=_h("nope")).status_code
        == 401
    )
    assert (
        client.post("/v1/ingest/runwatch.lifecycle", json=body, headers=_h(OPS)).status_code == 403
    )
    assert client.post("/v1/ingest/no.such.topic", json=body, headers=_h(A)).status_code == 404
    assert client.get("/v1/ingest/whoami", headers=_h(B)).json() == {"tenant_id": "tenant-b"}
    # a hook reads the control and lifecycle topics only
    r = client.get("/v1/ingest/runwatch.telemetry/partitions", headers=_h(A))
    assert r.status_code == 403


def _pages(client: TestClient, key: str, **params: str) -> list[dict[str, object]]:
    url = "/v1/ingest/runwatch.lifecycle/partitions/0/records"
    return [client.get(url, params=params, headers=_h(key)).json()]


def test_a_tenant_reads_its_own_records_and_none_of_anothers(
    gateway: tuple[TestClient, Path],
) -> None:
    client, _ = gateway
    mine = [_hooked(RunStarted, run=f"a-{i}") for i in range(3)]
    theirs = [_hooked(RunStarted, tenant="tenant-b", run=f"b-{i}") for i in range(3)]
    for a, b in zip(mine, theirs, strict=True):
        client.post("/v1/ingest/runwatch.lifecycle", json=_body(a), headers=_h(A))
        client.post("/v1/ingest/runwatch.lifecycle", json=_body(b), headers=_h(B))
    assert client.get("/v1/ingest/runwatch.lifecycle/partitions", headers=_h(A)).json() == {
        "partitions": [0]
    }
    (page,) = _pages(client, A)
    assert [decode(r["value"].encode()) for r in page["records"]] == mine  # type: ignore[union-attr,index]
    assert page["at_end"] is True
    (more,) = _pages(client, A, after=page["next"])  # type: ignore[arg-type]
    assert more["records"] == [] and more["at_end"] is True
    (page_b,) = _pages(client, B)
    assert [decode(r["value"].encode()) for r in page_b["records"]] == theirs  # type: ignore[union-attr,index]


def test_what_a_tenant_reads_tells_nothing_of_what_other_tenants_wrote(tmp_path: Path) -> None:
    """Found by review: the gateway answered with the records' offsets and the partition's
    end, so a tenant polling its reads learned how many lifecycle and control records the
    other tenants wrote, and when (their runs starting, pausing, being cancelled). Now the
    same reads answer the same whatever the others wrote, but for the sealed cursors."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {"keys": [{"key": A, "tenant": "tenant-a"}, {"key": B, "tenant": "tenant-b"}]}
        )
    )
    seen: list[list[dict[str, object]]] = []
    for others in (0, 40):
        app = create_app(lambda o=others: EmbeddedLog(tmp_path / f"log-{o}"), ApiKeys.load(keys))
        with TestClient(app) as client:
            answers: list[dict[str, object]] = []
            after: str | None = None
            for i in range(3):
                for j in range(others):
                    ev = _hooked(RunPaused, tenant="tenant-b", run=f"b-{i}-{j}")
                    client.post("/v1/ingest/runwatch.lifecycle", json=_body(ev), headers=_h(B))
                ev = _hooked(RunStarted, run=f"a-{i}").model_copy(update={"ts": float(i)})
                ev = ev.model_copy(update={"event_id": uuid.UUID(int=i + 1)})
                client.post("/v1/ingest/runwatch.lifecycle", json=_body(ev), headers=_h(A))
                (page,) = _pages(client, A, **({"after": after} if after else {}))
                after = page["next"]  # type: ignore[assignment]
                answers.append(page)
            seen.append(answers)
    for quiet, busy in zip(*seen, strict=True):
        assert set(quiet) == set(busy) == {"records", "next", "at_end"}
        assert quiet["at_end"] == busy["at_end"] is True
        strip = [{k: v for k, v in r.items() if k != "timestamp_ms"} for r in quiet["records"]]  # type: ignore[attr-defined]
        assert strip == [
            {k: v for k, v in r.items() if k != "timestamp_ms"} for r in busy["records"]
        ]  # type: ignore[attr-defined]
        assert all(set(r) == {"key", "value", "timestamp_ms"} for r in busy["records"])  # type: ignore[attr-defined]
        assert quiet["next"] != busy["next"] and len(quiet["next"]) == len(busy["next"])  # type: ignore[arg-type]


def test_a_cursor_opens_only_for_the_tenant_and_partition_it_was_made_for(
    gateway: tuple[TestClient, Path],
) -> None:
    client, _ = gateway
    client.post("/v1/ingest/runwatch.lifecycle", json=_body(_hooked(RunStarted)), headers=_h(A))
    (page,) = _pages(client, A)
    cursor = page["next"]
    assert isinstance(cursor, str)
    for key, url, after in [
        (B, "/v1/ingest/runwatch.lifecycle/partitions/0/records", cursor),  # another tenant
        (A, "/v1/ingest/runwatch.control/partitions/0/records", cursor),  # another topic
        (A, "/v1/ingest/runwatch.lifecycle/partitions/0/records", cursor[:-2] + "AA"),
        (A, "/v1/ingest/runwatch.lifecycle/partitions/0/records", "not-a-cursor"),
    ]:
        r = client.get(url, params={"after": after}, headers=_h(key))
        assert r.status_code == 410, (url, r.text)
    r = client.get("/v1/ingest/runwatch.lifecycle/partitions/0/end", headers=_h(A))
    assert r.status_code == 410 and "upgrade" in r.text  # an offset too: not served
    r = client.get(  # what a hook from before cursors asks: told to upgrade
        "/v1/ingest/runwatch.lifecycle/partitions/0/records",
        params={"start": 0},
        headers=_h(A),
    )
    assert r.status_code == 410 and "upgrade the runwatch hook" in r.text
    r = client.get(  # another tenant's run key: refused (its skip time would tell its size)
        "/v1/ingest/runwatch.lifecycle/partitions/0/records",
        params={"key": "tenant-b:run-1"},
        headers=_h(A),
    )
    assert r.status_code == 403


def test_a_tenant_over_its_rate_is_told_when_to_retry(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {"keys": [{"key": A, "tenant": "tenant-a"}, {"key": B, "tenant": "tenant-b"}]}
        )
    )
    with pytest.raises(ValueError, match="one whole request"):  # a burst below a request
        create_app(lambda: EmbeddedLog(tmp_path / "log"), ApiKeys.load(keys), record_burst=3)
    app = create_app(
        lambda: EmbeddedLog(tmp_path / "log"), ApiKeys.load(keys),
        record_rate=1.0, record_burst=MAX_RECORDS, read_rate=1.0, read_burst=50,
    )  # fmt: skip
    with TestClient(app) as client:
        many = _body(*(_hooked(RunStarted, run=f"r-{i}") for i in range(MAX_RECORDS)))
        assert (
            client.post("/v1/ingest/runwatch.lifecycle", json=many, headers=_h(A)).status_code
            == 200
        )
        one = _body(_hooked(RunStarted, run="r-last"))
        r = client.post("/v1/ingest/runwatch.lifecycle", json=one, headers=_h(A))
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        other = _body(_hooked(RunStarted, tenant="tenant-b", run="b"))
        assert (
            client.post("/v1/ingest/runwatch.lifecycle", json=other, headers=_h(B)).status_code
            == 200
        )
        # a read of one run's key skips the other records unread: cheap
        url = "/v1/ingest/runwatch.lifecycle/partitions/0/records"
        page = client.get(url, params={"key": "tenant-a:r-7"}, headers=_h(A)).json()
        assert [decode(r["value"].encode()).run_id for r in page["records"]] == ["tenant-a:r-7"]
        assert page["at_end"] is True and "end" not in page
        # (5,001 others skipped, 1 decoded: 1 + 5001/400 + 1/160 = 13.5 of the 50 tokens);
        # a read that decodes 5,000 records costs 5000/160 = 31.25 more: the next one waits
        assert client.get(url, headers=_h(A)).status_code == 200
        r = client.get(url, headers=_h(A))
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 4


def test_an_oversized_record_is_refused_and_its_dead_letter_kept_small(
    gateway: tuple[TestClient, Path],
) -> None:
    client, log_dir = gateway
    big = _hooked(TrainerStepCompleted).model_copy(update={"extra": (("note", "x" * (600 << 10)),)})
    r = client.post("/v1/ingest/runwatch.telemetry", json=_body(big), headers=_h(A))
    assert r.status_code == 200 and r.json()["refused"][0]["kind"] == "refused_at_ingest"
    assert "over the 524288" in r.json()["refused"][0]["reason"]
    (letter,) = [DeadLetter.model_validate_json(v) for v in _on_log(log_dir, DEAD_LETTER_TOPIC)]
    assert letter.raw == encode(big)[: 64 << 10]
    assert _on_log(log_dir, "runwatch.telemetry") == []


# -- a scan is paid for and shares the event loop (review finding 1, 2026-11-28) --------------

RECORDS = "/v1/ingest/runwatch.lifecycle/partitions/0/records"


def _shared_topic(tmp_path: Path, others: int) -> tuple[ApiKeys, Path]:
    """Keys of tenants a and b, and a log whose lifecycle topic holds ``others`` records of
    a third tenant's runs (the shared history a keyed read skips), then one of a's run."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {"keys": [{"key": A, "tenant": "tenant-a"}, {"key": B, "tenant": "tenant-b"}]}
        )
    )
    log_dir = tmp_path / "log"
    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    value = encode(_hooked(RunStarted, tenant="tenant-c", run="c"))
    for i in range(0, others, 50_000):
        batch = [
            (f"tenant-c:c-{j % 1000}".encode(), value) for j in range(i, min(others, i + 50_000))
        ]
        log.append_many_sync("runwatch.lifecycle", batch)
    own = _hooked(RunStarted, run="mine")
    log.append_many_sync("runwatch.lifecycle", [(own.key(), encode(own))])
    return ApiKeys.load(keys), log_dir


def test_a_keyed_scan_is_charged_for_the_records_it_skipped(tmp_path: Path) -> None:
    """Found by review: a keyed read skipped up to 200,000 records for 1 token (only decoded
    records were charged), so a tenant's burst of 1,000 reads bought minutes of the event
    loop. Now each skipped record costs 1/SKIP_COST of a token (:func:`scan_cost`), and a
    hook's own use, a first read of a long shared topic then polls from the cursor at the
    end, still fits its budget."""
    keys, log_dir = _shared_topic(tmp_path, 8_000)
    assert scan_cost(8_000, 1) == 1 + 8_000 / SKIP_COST + 1 / 160
    burst = 30  # > one scan (1 + 20 + 1/160 = 21.0), < two
    app = create_app(lambda: EmbeddedLog(log_dir), keys, read_rate=0.01, read_burst=burst)
    with TestClient(app) as client:
        first = client.get(RECORDS, params={"key": "tenant-a:mine"}, headers=_h(A))
        assert first.status_code == 200 and first.json()["at_end"] is True
        assert [decode(r["value"].encode()).run_id for r in first.json()["records"]] == [
            "tenant-a:mine"
        ]
        # a hook polling its run from the cursor at the end: a token a poll (7 of 30 - 21)
        for _ in range(7):
            r = client.get(
                RECORDS, params={"key": "tenant-a:mine", "after": first.json()["next"]},
                headers=_h(A),
            )  # fmt: skip
            assert r.status_code == 200 and r.json()["records"] == []
        # the 8,000 skips were charged: another scan of them is over the burst
        again = client.get(RECORDS, params={"key": "tenant-a:nothing"}, headers=_h(A))
        assert again.status_code == 429, again.text
        # its 1 token taken, 20 for the scan wanted: retry once the rate paid ~19 of them
        assert int(again.headers["Retry-After"]) >= 1_800
        # another tenant's reads are its own
        assert client.get(RECORDS, params={"key": "tenant-b:x"}, headers=_h(B)).status_code == 200


def test_a_burst_of_scans_is_refused_beyond_what_the_tenants_tokens_pay_for(
    tmp_path: Path,
) -> None:
    """Found by review: a scan was charged after it ran, so a burst of 30 queued 30 scans
    of the whole topic at once. Now a scan's worst case is taken before it starts (and the
    unused part given back): of 16 concurrent scans of KEY_SCAN_BUDGET = 50,000 records
    (126 tokens each), only what the burst of 1,000 pays for runs (7); the rest are 429 at
    once."""
    keys, log_dir = _shared_topic(tmp_path, 100_000)
    app = create_app(lambda: EmbeddedLog(log_dir), keys, read_rate=1.0)
    codes: list[int] = []
    with TestClient(app) as client:

        def scan() -> None:
            r = client.get(RECORDS, params={"key": "tenant-a:nothing"}, headers=_h(A))
            codes.append(r.status_code)

        threads = [threading.Thread(target=scan) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert codes.count(200) <= 1_000 // scan_cost(KEY_SCAN_BUDGET, 0) + 1, codes
    assert codes.count(429) >= 8, codes


def test_another_tenants_requests_are_answered_while_a_tenant_scans(tmp_path: Path) -> None:
    """Found by review: a keyed scan ran on the event loop without yielding, so every other
    tenant's request waited for it (B's whoami 0.7 ms -> 6.3 s during A's burst). Now the
    scan gives the loop away every SLICE_S: B's requests are answered while A scans, in a
    fraction of the time a scan takes (a bound relative to the scan measured here,
    since this machine's speed varies)."""
    keys, log_dir = _shared_topic(tmp_path, 150_000)
    app = create_app(lambda: EmbeddedLog(log_dir), keys)
    with TestClient(app) as client:
        t = time.perf_counter()
        assert client.get(RECORDS, params={"key": "tenant-a:x"}, headers=_h(A)).status_code == 200
        scan_s = time.perf_counter() - t
        scanning = threading.Event()
        done = threading.Event()

        def attack() -> None:
            while not done.is_set():  # A's scans back to back (2 in flight), within its burst
                scanning.set()
                client.get(RECORDS, params={"key": "tenant-a:x"}, headers=_h(A))

        attackers = [threading.Thread(target=attack) for _ in range(2)]
        for a in attackers:
            a.start()
        scanning.wait()
        time.sleep(scan_s / 2)
        waits = []
        try:
            for _ in range(10):
                t = time.perf_counter()
                assert client.get("/v1/ingest/whoami", headers=_h(B)).status_code == 200
                waits.append(time.perf_counter() - t)
        finally:
            done.set()
            for a in attackers:
                a.join()
    assert scan_s > 0.05, scan_s  # a scan long enough to tell
    # before: B waited for the scans ahead of it (median 2.5x a scan, here); now it waits
    # a slice of each scan in flight per step of its own request (0.3-0.6x a scan, here,
    # in process: TestClient's request takes many loop steps; ~10x less on a real server)
    assert statistics.median(waits) < scan_s, (statistics.median(waits), scan_s)
