"""The notifier as a real process (``runwatch notify``) against real HTTP receivers.

The events are appended to a real embedded log by this process (as the projections would);
the notifier is another process; the receivers are threaded ``http.server``s on
127.0.0.1 that verify every signature.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from events import (
    AlertFired,
    AlertResolved,
    NotificationAbandoned,
    NotificationAttempted,
    NotificationDelivered,
    RunStateChanged,
)
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from runwatch.notifier_receiver import Received, WebhookReceiver
from stream_processors.notify import render

pytestmark = pytest.mark.timeout(120)

#: the tests' receiver listens on loopback, which the notifier refuses by default
LOOPBACK = ("--allow-private-webhooks",)
ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"acme": b"acme-secret-0123456789", "globex": b"globex-secret-0123456789"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "runwatch.cli.main", *args]


def source(cls: type[EventBase], tenant: str, run: str, **kw: Any) -> EventBase:
    return cls(
        event_id=uuid.uuid4(),
        tenant_id=tenant,
        run_id=run,
        step=kw.pop("step", 10),
        ts=time.time(),
        producer="projections/run-state",
        seq=0,
        **kw,
    )


def state_change(tenant: str, run: str, to: str = "DEGRADED") -> EventBase:
    return source(
        RunStateChanged, tenant, run, from_state="RUNNING", to_state=to, reason="kl_blowup"
    )


def alert(tenant: str, run: str, routing: str = "page", alert_id: str = "a1") -> EventBase:
    return source(
        AlertFired,
        tenant,
        run,
        alert_id=alert_id,
        detector="kl_blowup",
        layer="algorithmic",
        routing=routing,
        window_start=1,
        window_end=10,
        config_version="v1",
        reason="KL slope 3x the cap",
        first_response="lower the LR",
    )


def keys_file(tmp_path: Path, urls: dict[str, str]) -> Path:
    tenants: dict[str, Any] = {}
    for tenant, url in urls.items():
        (tmp_path / f"{tenant}.secret").write_bytes(SECRETS.get(tenant, b"x" * 20) + b"\n")
        tenants[tenant] = {"webhook": {"url": url, "secret_file": f"{tenant}.secret"}}
    path = tmp_path / "keys.yaml"
    keys = [{"key": f"rk_{t}", "tenant": t} for t in urls]
    path.write_text(yaml.safe_dump({"keys": keys, "tenants": tenants}))
    return path


def start_notifier(log: Path, keys: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _cli("notify", "--log", str(log), "--keys", str(keys), "--json", *LOOPBACK, *extra),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    if proc.poll() is None:
        proc.terminate()
    out, err = proc.communicate(timeout=30)
    return out, err


def notifications(log: Path) -> list[EventBase]:
    reader = EmbeddedLog(log, readonly=True)
    reader.open_sync()
    if "runwatch.notifications" not in reader.topic_names():
        return []
    return [e for e in reader.iter_events(["runwatch.notifications"]) if isinstance(e, EventBase)]


def wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[str]) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"notifier exited: {proc.communicate()}")
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_retried_until_accepted_signed_recorded_and_abandoned_after_n(tmp_path: Path) -> None:
    log = tmp_path / "log"

    def acme(rec: Received) -> int:  # the first two attempts of every notification fail
        return 500 if rec.attempt <= 2 else 200

    with (
        WebhookReceiver(secrets={"/acme": SECRETS["acme"]}, answer=acme) as ok_after_2,
        WebhookReceiver(secrets={"/globex": SECRETS["globex"]}, answer=lambda r: 500) as dead,
    ):
        keys = keys_file(tmp_path, {"acme": ok_after_2.url("/acme"), "globex": dead.url("/globex")})
        writer = EmbeddedLog(log)
        writer.open_sync()
        fired = alert("acme", "acme-run", "page", "a1")
        acme_events = [state_change("acme", "acme-run"), fired]
        not_sent = [
            alert("acme", "acme-run", "advisory", "a2"),  # advisory: never sent
            source(
                AlertResolved,
                "acme",
                "acme-run",
                alert_id="a2",
                detector="kl_blowup",
                reason="ok",
                config_version="v1",
            ),
            state_change("initech", "initech-run"),  # no webhook configured
        ]
        globex_event = state_change("globex", "globex-run", to="FAILED")
        writer.append_events_sync([*acme_events, *not_sent, globex_event])

        proc = start_notifier(
            log,
            keys,
            "--max-attempts",
            "3",
            "--backoff-base-s",
            "0.3",
            "--backoff-factor",
            "2",
            "--jitter",
            "0",
            "--timeout-s",
            "2",
        )
        try:

            def outcomes() -> list[EventBase]:
                return [
                    e
                    for e in notifications(log)
                    if isinstance(e, NotificationDelivered | NotificationAbandoned)
                ]

            wait_for(lambda: len(outcomes()) >= 3, 30, "3 outcomes", proc)
            resolve = source(
                AlertResolved,
                "acme",
                "acme-run",
                alert_id="a1",
                detector="kl_blowup",
                reason="KL back under the cap",
                config_version="v1",
            )
            writer.append_events_sync([resolve])
            acme_events.append(resolve)
            wait_for(lambda: len(outcomes()) >= 4, 30, "the resolve's outcome", proc)
            time.sleep(0.5)  # nothing else may come
        finally:
            out, err = stop(proc)
        assert proc.returncode == 0, err
        stats = json.loads(out.strip().splitlines()[-1])

        # acme: 3 attempts each (500, 500, 200), every one signed and valid, same body
        for ev in acme_events:
            got = ok_after_2.attempts_of(str(ev.event_id))
            assert [r.attempt for r in got] == [1, 2, 3], got
            assert [r.status for r in got] == [500, 500, 200]
            assert all(r.valid for r in got)
            assert {r.body for r in got} == {render(ev)}
            assert got[0].headers["X-Runwatch-Event"] in ("run.state_changed", "alert.fired",
                                                        "alert.resolved")  # fmt: skip
            # the backoff was waited: 0.3 s then 0.6 s (the clock of the receiver)
            assert got[1].arrived - got[0].arrived >= 0.25
            assert got[2].arrived - got[1].arrived >= 0.55
        assert ok_after_2.counts()["invalid"] == 0
        assert ok_after_2.counts()["delivered"] == 3 and ok_after_2.counts()["duplicates"] == 0
        sent_ids = {r.delivery_id for r in ok_after_2.received + dead.received}
        for ev in not_sent:
            assert str(ev.event_id) not in sent_ids

        # globex: 3 failures -> abandoned, with the body kept
        assert [r.status for r in dead.received] == [500, 500, 500]
        assert all(r.valid for r in dead.received)

        recorded = notifications(log)
        by_id: dict[str, list[EventBase]] = {}
        for e in recorded:
            by_id.setdefault(e.notification_id, []).append(e)  # type: ignore[attr-defined]
        assert set(by_id) == {str(e.event_id) for e in [*acme_events, globex_event]}
        for ev in acme_events:
            events = by_id[str(ev.event_id)]
            tries = [e for e in events if isinstance(e, NotificationAttempted)]
            assert [(a.attempt, a.ok, a.status_code) for a in tries] == [
                (1, False, 500),
                (2, False, 500),
                (3, True, 200),
            ]
            assert all(a.endpoint == ok_after_2.url("/acme") for a in tries)
            (done,) = [e for e in events if isinstance(e, NotificationDelivered)]
            assert done.attempts == 3 and done.status_code == 200 and done.latency_s > 0.8
            assert (done.tenant_id, done.run_id) == ("acme", "acme-run")
        events = by_id[str(globex_event.event_id)]
        assert [e.type for e in events] == ["NotificationAttempted"] * 3 + ["NotificationAbandoned"]
        abandoned = events[-1]
        assert isinstance(abandoned, NotificationAbandoned)
        assert abandoned.attempts == 3 and abandoned.last_status_code == 500
        assert "3 attempts failed" in abandoned.reason
        assert abandoned.body.encode() == render(globex_event)
        assert stats["delivered"] == 3 and stats["abandoned"] == 1 and stats["attempts"] == 12


def test_a_malformed_webhook_url_refuses_to_start(tmp_path: Path) -> None:
    keys = keys_file(tmp_path, {"acme": "ftp://hooks.acme.example/runwatch"})
    out = subprocess.run(
        _cli("notify", "--log", str(tmp_path / "log"), "--keys", str(keys)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert (
        "tenants.acme.webhook.url" in out.stderr and "not an http:// or https:// URL" in out.stderr
    )


def test_a_damaged_state_file_stops_the_notifier_with_the_remedy(tmp_path: Path) -> None:
    """The notifier's state is a snapshot plus a journal of saves
    (``runwatch/hosting/state_journal.py``); one that is not what it writes stops the
    notifier with how to rebuild, not a traceback."""
    keys = keys_file(tmp_path, {"acme": "http://127.0.0.1:9/runwatch"})
    state = tmp_path / "notifier.state.json"
    state.write_text('{"positions": {"runwatch.alerts:0": "x"}, "slots": {}}')
    out = subprocess.run(
        _cli("notify", "--log", str(tmp_path / "log"), "--keys", str(keys), "--state", str(state)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "bug in runwatch" not in out.stderr
    assert "not a state snapshot" in out.stderr and "rebuild it from the log" in out.stderr


def test_a_hanging_receiver_does_not_hold_back_another_tenant(tmp_path: Path) -> None:
    """One tenant's endpoint answers nothing for longer than the timeout; the other
    tenant's notifications still arrive at once, and the hang is recorded as a timeout."""
    log = tmp_path / "log"
    with (
        WebhookReceiver(default_secret=SECRETS["acme"], delay_s=3.0) as hanging,
        WebhookReceiver(default_secret=SECRETS["globex"]) as fast,
    ):
        keys = keys_file(tmp_path, {"acme": hanging.url("/a"), "globex": fast.url("/g")})
        writer = EmbeddedLog(log)
        writer.open_sync()
        proc = start_notifier(log, keys, "--timeout-s", "1", "--backoff-base-s", "5")
        try:
            # saturate acme: more runs than its in-flight slots
            writer.append_events_sync([state_change("acme", f"a-{i}") for i in range(8)])
            time.sleep(0.3)
            lat = []
            for i in range(5):
                ev = state_change("globex", f"g-{i}")
                writer.append_events_sync([ev])
                wait_for(lambda ev=ev: fast.attempts_of(str(ev.event_id)), 10, "globex", proc)
                lat.append(fast.attempts_of(str(ev.event_id))[0].arrived - ev.ts)
            wait_for(
                lambda: any(
                    isinstance(e, NotificationAttempted) and e.error.startswith("timeout")
                    for e in notifications(log)
                ),
                15,
                "a recorded timeout",
                proc,
            )
        finally:
            stop(proc)
        assert max(lat) < 1.0, lat  # not behind acme's 1 s timeouts
        timeouts = [
            e for e in notifications(log) if isinstance(e, NotificationAttempted) and not e.ok
        ]
        assert timeouts and all(e.tenant_id == "acme" for e in timeouts)
        assert all(e.status_code is None and e.duration_ms >= 900 for e in timeouts)
