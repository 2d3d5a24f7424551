"""Exactly once for retried pushes, for real: ``runwatch serve trajectories --kafka`` is
killed (kill -9) mid-push several times while concurrent pushers retry every push that
did not get its 200, with the push's ``Idempotency-Key``, until it does. Afterwards
every group is served by ``/batch`` exactly once: 0 lost, 0 duplicated.

Counted and printed: pushes sent (attempts), acknowledged, retried, answered as a replay
(the first attempt had reached the log, its 200 was lost), group records on the log,
repeats the fold dropped, groups served."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from events.catalog.trajectory import (
    BATCHES_TOPIC,
    TRAJECTORIES_TOPIC,
    ScoredDataGroupStored,
    TrajectoryGroupDeduplicated,
)
from events.codec import decode
from events.log.kafka import KafkaLog
from tests.integration.test_trajectory_processes import (
    REGISTRATION,
    Server,
    free_port,
    get_batch,
    groups,
)

GROUPS_PER_PUSH = 4


@dataclass
class Tally:
    """What the pushers did (threads add under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    attempts: int = 0
    acked: set[int] = field(default_factory=set)
    retried_pushes: int = 0
    replayed: int = 0
    unacked: set[int] = field(default_factory=set)


class KeyedPusher(threading.Thread):
    """Pushes lists of 4 groups, each push under its own Idempotency-Key, and retries a
    push (same body, same key) until it gets a 200; stops between pushes when told."""

    def __init__(self, n: int, url: str, tally: Tally, pause_s: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.n, self.url, self.tally, self.pause_s = n, url, tally, pause_s
        self.halt = threading.Event()
        self.deadline = float("inf")

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            push = 0
            while not self.halt.is_set():
                first = (self.n * 1_000_000) + push * GROUPS_PER_PUSH
                markers = range(first, first + GROUPS_PER_PUSH)
                self.send(client, f"pusher{self.n}-push{push}", markers)
                push += 1
                time.sleep(self.pause_s)

    def send(self, client: httpx.Client, key: str, markers: range) -> None:
        body, tries = groups(markers), 0
        while time.monotonic() < self.deadline:
            tries += 1
            with self.tally.lock:
                self.tally.attempts += 1
            try:
                r = client.post(
                    self.url + "/scored_data_list", json=body, headers={"Idempotency-Key": key}
                )
                if r.status_code == 200:
                    with self.tally.lock:
                        self.tally.acked.update(markers)
                        self.tally.retried_pushes += tries > 1
                        self.tally.replayed += r.headers.get("idempotent-replayed") == "true"
                    return
                assert r.status_code >= 500, r.text  # only "come back later" is retried
            except httpx.HTTPError:
                pass
            time.sleep(0.05 + 0.1 * random.random())
        with self.tally.lock:
            self.tally.unacked.update(markers)


async def _log_counts(bootstrap: str, run_id: str) -> tuple[int, int]:
    """(ScoredDataGroupStored records of the run, TrajectoryGroupDeduplicated of it)."""
    stored = dropped = 0
    async with KafkaLog(bootstrap, create_registry_topics=False) as log:
        for topic in (TRAJECTORIES_TOPIC, BATCHES_TOPIC):
            for partition in await log.partitions(topic):
                async for rec in log.read(topic, partition):
                    if rec.key != run_id.encode():
                        continue
                    ev = decode(rec.value)
                    stored += isinstance(ev, ScoredDataGroupStored)
                    dropped += isinstance(ev, TrajectoryGroupDeduplicated)
    return stored, dropped


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_kill9_mid_push_with_keyed_retries_serves_every_group_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    kills, pushers_n = 5, 4
    run_id = f"retry-{uuid.uuid4().hex[:6]}"
    server = Server(free_port(), ["--kafka", kafka_bootstrap], "api-a", run_id, tmp_path)
    server.start()
    tally = Tally()
    pushers = [KeyedPusher(i, server.url, tally) for i in range(pushers_n)]
    served: Counter[int] = Counter()
    try:
        httpx.post(server.url + "/register", json=REGISTRATION).raise_for_status()
        for p in pushers:
            p.deadline = time.monotonic() + 300
            p.start()
        for _ in range(kills):
            time.sleep(0.4 + 0.6 * random.random())  # pushes in flight, some durable
            server.kill9()
            time.sleep(0.2)  # retries meet a closed port meanwhile
            server.start()
        time.sleep(1.0)
        for p in pushers:
            p.halt.set()
        for p in pushers:
            p.join(120)
            assert not p.is_alive(), "a pusher never got its push acknowledged"
        assert not tally.unacked
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 120
            while not tally.acked <= set(served) and time.monotonic() < deadline:
                got = get_batch(client, server.url)
                if got is None:
                    time.sleep(0.05)
                    continue
                served.update(got)
            assert get_batch(client, server.url) is None  # nothing left in the queue
    finally:
        server.stop()
    stored, dropped = asyncio.run(_log_counts(kafka_bootstrap, run_id))
    twice = {m: n for m, n in served.items() if n > 1}
    lost = tally.acked - set(served)
    print(
        f"\nretry test: {kills} kills, {pushers_n} pushers; {tally.attempts} push attempts, "
        f"{len(tally.acked) // GROUPS_PER_PUSH} pushes acknowledged "
        f"({tally.retried_pushes} after a retry, {tally.replayed} answered as a replay); "
        f"{stored} group records on the log, {dropped} repeats dropped by the fold, "
        f"{len(tally.acked)} groups acknowledged, {sum(served.values())} served; "
        f"{len(lost)} lost, {len(twice)} served twice"
    )
    assert not twice, f"served more than once: {dict(list(twice.items())[:20])}"
    assert not lost, f"acknowledged but never served: {sorted(lost)[:20]}"
    assert set(served) == tally.acked  # nothing else appears
    assert tally.retried_pushes > 0, "no kill landed mid-push"
    assert stored - dropped == len(tally.acked)  # what the fold kept is what was pushed
