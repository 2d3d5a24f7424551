"""kill -9 of the notifier mid-stream: nothing lost, duplicates only of what was in flight.

A producer thread keeps appending customer-visible facts (state changes, paging alerts and
their resolves, plus re-published copies of some, as an at-least-once upstream does) to a
real embedded log while a real ``runwatch notify`` process delivers them to a real HTTP
receiver on 127.0.0.1 (which fails the first attempt of every fifth notification, so
retries are pending when the kill lands). The notifier is SIGKILLed twice mid-stream and
restarted; then every fact must have been accepted by the receiver, and the log must hold
exactly one ``NotificationDelivered`` per fact.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from events import AlertFired, AlertResolved, NotificationDelivered, RunStateChanged
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from runwatch.notifier_receiver import Received, WebhookReceiver
from tests.integration.test_notifier import SECRETS, keys_file, notifications, start_notifier

pytestmark = pytest.mark.timeout(180)

MAX_IN_FLIGHT = 8


def facts(n_runs: int, per_run: int) -> list[EventBase]:
    """Per run: state changes, a paging alert, its resolve, more state changes."""
    out: list[EventBase] = []
    for r in range(n_runs):
        tenant = "acme" if r % 2 else "globex"
        run = f"{tenant}-run-{r}"
        for k in range(per_run):
            env = {
                "event_id": uuid.uuid4(),
                "tenant_id": tenant,
                "run_id": run,
                "step": k,
                "ts": 0.0,
                "producer": "projections/run-state",
                "seq": 0,
            }
            if k % 4 == 1:
                out.append(
                    AlertFired(
                        **env,
                        alert_id=f"{run}-a{k}",
                        detector="kl_blowup",
                        layer="algorithmic",
                        routing="page",
                        window_start=k,
                        window_end=k,
                        config_version="v1",
                        reason="KL slope over the cap",
                        first_response="lower the LR",
                    )
                )
            elif k % 4 == 2:
                out.append(
                    AlertResolved(
                        **env,
                        alert_id=f"{run}-a{k - 1}",
                        detector="kl_blowup",
                        reason="back under the cap",
                        config_version="v1",
                    )
                )
            else:
                out.append(
                    RunStateChanged(
                        **env,
                        from_state="RUNNING" if k % 2 else "DEGRADED",
                        to_state="DEGRADED" if k % 2 else "RUNNING",
                        reason=f"change {k}",
                    )
                )
    return out


def test_kill_9_mid_stream_loses_nothing(tmp_path: Path) -> None:
    log = tmp_path / "log"
    plan = facts(n_runs=12, per_run=16)  # 192 facts
    # interleave runs, as a live plane does
    plan.sort(key=lambda e: (e.step, e.run_id))

    def answer(rec: Received) -> int:
        first_fails = int(rec.delivery_id[:8], 16) % 5 == 0
        return 503 if first_fails and rec.attempt == 1 else 200

    with WebhookReceiver(
        secrets={"/acme": SECRETS["acme"], "/globex": SECRETS["globex"]},
        answer=answer,
        delay_s=0.005,
    ) as receiver:
        keys = keys_file(
            tmp_path, {"acme": receiver.url("/acme"), "globex": receiver.url("/globex")}
        )
        writer = EmbeddedLog(log)
        writer.open_sync()
        args = ("--backoff-base-s", "0.2", "--jitter", "0", "--max-in-flight", str(MAX_IN_FLIGHT))
        appended: list[EventBase] = []
        republished = 0

        def produce() -> None:
            nonlocal republished
            for i, ev in enumerate(plan):
                ev = ev.model_copy(update={"ts": time.time()})
                batch = [ev]
                if i % 10 == 9:  # an at-least-once upstream re-publishes an earlier fact
                    batch.append(appended[i - 5])
                    republished += 1
                writer.append_events_sync(batch)
                appended.append(ev)
                time.sleep(0.012)

        producer = threading.Thread(target=produce)
        proc = start_notifier(log, keys, *args)
        producer.start()
        kills = []
        try:
            for at in (0.8, 1.6):
                while len(appended) < at * len(plan) / 2.4:
                    time.sleep(0.01)
                time.sleep(0.05)
                received_at_kill = len(receiver.received)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                assert proc.returncode == -signal.SIGKILL
                kills.append(received_at_kill)
                time.sleep(0.3)  # dead for a while: the stream goes on
                proc = start_notifier(log, keys, *args)
            producer.join(timeout=60)
            expected = {str(e.event_id) for e in appended}
            end = time.monotonic() + 60
            while not expected <= set(receiver.accepted):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < end, f"{len(expected - set(receiver.accepted))} missing"
                time.sleep(0.05)
            # and the log records each delivery once (its outcome is derived after the 2xx)
            while time.monotonic() < end:
                done = {
                    e.notification_id
                    for e in notifications(log)
                    if isinstance(e, NotificationDelivered)
                }
                if done >= expected:
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=30)
            producer.join(timeout=60)

        counts = receiver.counts()
        delivered_events = [e for e in notifications(log) if isinstance(e, NotificationDelivered)]
        unique = {e.event_id for e in delivered_events}
        sent = len(expected)
        stored = len(appended) + republished
        lost = len(expected - set(receiver.accepted))
        summary = (
            f"sent {sent} facts ({stored} records, {republished} re-published), "
            f"delivered {counts['delivered']}, duplicated {counts['duplicates']}, lost {lost}; "
            f"{counts['requests']} requests, {len(kills)} kills, "
            f"{len(delivered_events)} NotificationDelivered records ({len(unique)} unique)"
        )
        print(summary)
        assert lost == 0, summary
        assert counts["invalid"] == 0, summary
        assert counts["delivered"] == sent, summary
        # a kill re-sends at most what was in flight; a re-published fact is never re-sent
        assert counts["duplicates"] <= len(kills) * MAX_IN_FLIGHT, summary
        assert {e.notification_id for e in delivered_events} == expected
        assert len(unique) == sent, summary
