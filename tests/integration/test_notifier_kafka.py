"""The notifier on a real Kafka broker: its own consumer group over the three topics'
partitions, a receiver that fails the first attempt, a kill -9 and a restart."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from events import NotificationAttempted, NotificationDelivered, encode
from events.codec import decode
from events.envelope import EventBase
from events.log.kafka import KafkaLog
from runwatch.notifier_receiver import Received, WebhookReceiver
from tests.integration.test_notifier import ROOT, _cli, alert, keys_file, state_change

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

DEFAULT_SECRET = b"x" * 20  # what keys_file gives a tenant it has no secret for


async def _append(bootstrap: str, events: list[EventBase]) -> None:
    async with KafkaLog(bootstrap, client_id="notifier-test") as log:
        for ev in events:
            await log.append(type(ev).TOPIC, ev.key(), encode(ev))


async def _notifications(bootstrap: str, tenants: set[str]) -> list[EventBase]:
    out: list[EventBase] = []
    async with KafkaLog(bootstrap, client_id="notifier-test-reader") as log:
        for p in await log.partitions("runwatch.notifications"):
            async for rec in log.read("runwatch.notifications", p):
                ev = decode(rec.value)
                if isinstance(ev, EventBase) and ev.tenant_id in tenants:
                    out.append(ev)
    return out


def test_notifier_on_kafka_survives_kill_9(kafka_bootstrap: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    acme, globex = f"acme-{tag}", f"globex-{tag}"  # the shared broker holds other tests' facts

    def answer(rec: Received) -> int:
        return 500 if rec.attempt == 1 else 200

    with WebhookReceiver(default_secret=DEFAULT_SECRET, answer=answer) as rx:
        keys = keys_file(tmp_path, {acme: rx.url("/a"), globex: rx.url("/g")})
        cmd = _cli(
            "notify",
            "--allow-private-webhooks",  # the receiver listens on loopback
            "--kafka",
            kafka_bootstrap,
            "--keys",
            str(keys),
            "--state",
            str(tmp_path / "state.json"),
            "--group",
            f"notifier-{tag}",
            "--backoff-base-s",
            "0.2",
            "--jitter",
            "0",
        )
        first = [state_change(t, f"{t}-r{i}") for t in (acme, globex) for i in range(4)]
        second = [alert(t, f"{t}-r{i}", "page", f"a{i}") for t in (acme, globex) for i in range(4)]
        asyncio.run(_append(kafka_bootstrap, first))
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            end = time.monotonic() + 90
            while len(rx.accepted) < len(first) // 2:  # some delivered
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < end, rx.counts()
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            asyncio.run(_append(kafka_bootstrap, second))  # while it is dead
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            expected = {str(e.event_id) for e in first + second}
            end = time.monotonic() + 120  # the dead member's session must time out first
            while not expected <= set(rx.accepted):
                assert proc.poll() is None, proc.communicate()
                if time.monotonic() > end:
                    proc.terminate()
                    _, err = proc.communicate(timeout=30)
                    missing = expected - set(rx.accepted)
                    seen = [(e.type, e.notification_id[:8], getattr(e, "attempt", None))
                            for e in asyncio.run(_notifications(kafka_bootstrap, {acme, globex}))
                            if e.notification_id in missing]  # fmt: skip
                    which = [
                        (e.type, e.run_id) for e in first + second if str(e.event_id) in missing
                    ]
                    tries = [(r.delivery_id[:8], r.attempt, r.status) for r in rx.received
                             if r.delivery_id in missing]  # fmt: skip
                    raise AssertionError(
                        f"missing {which}: recorded {seen}, received {tries}; {err}"
                    )
                time.sleep(0.1)
            time.sleep(1.0)  # the last outcomes are recorded
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=30)
    assert rx.counts()["invalid"] == 0
    assert set(rx.accepted) == expected
    assert rx.counts()["duplicates"] <= 8
    recorded = asyncio.run(_notifications(kafka_bootstrap, {acme, globex}))
    delivered = {e.notification_id for e in recorded if isinstance(e, NotificationDelivered)}
    assert delivered == expected
    firsts = [e for e in recorded if isinstance(e, NotificationAttempted) and e.attempt == 1]
    assert {e.notification_id for e in firsts} == expected and not any(e.ok for e in firsts)
