"""Webhook delivery latency on loopback, and what a notifier ``kill -9`` loses.

Figure: a real ``runwatch notify`` process follows a real embedded log (fsync per append)
while this process appends customer-visible facts (state changes and paging alerts of
several runs and two tenants) at ``--rate`` per second; a threaded ``http.server`` receiver
on 127.0.0.1 verifies every signature. Latency of one notification = the receiver's
arrival time minus the moment the append of the fact returned (durable; one clock: same
host). Printed: p50 / p99 / max (goal p99 < 1 s), and the notifier's CPU per fact.

Anchor, same run, same receiver, same body sizes: a plain HTTP POST round trip on loopback
(httpx, keep-alive, one at a time) — the floor any webhook sender pays. The ratio says
what the log hop, the poll, the fold, signing and recording the attempt add.

Then the crash phase (``--kill``, on by default): the same stream, the notifier SIGKILLed
mid-stream and restarted; printed: facts sent, delivered, duplicated (the receiver saw an
id accepted twice: the ones in flight at the kill), lost (goal 0).

What is stable: the anchor and the p50 are dominated by this box's load (2 cores shared
with other jobs); the p99 is the poll interval plus an fsync or two plus scheduling.

Usage: python benchmarks/webhook_delivery.py [--events 600] [--rate 100] [--no-kill]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import yaml

from events import AlertFired, RunStateChanged
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from runwatch.notifier_receiver import WebhookReceiver
from stream_processors.notify import render
from stream_processors.notify.signing import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from stream_processors.notify.signing import signature as sign

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"benchmark-webhook-secret"
CLI = [sys.executable, "-m", "runwatch.cli.main"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def fact(i: int) -> EventBase:
    tenant = "acme" if i % 2 else "globex"
    env = {
        "event_id": uuid.uuid4(),
        "tenant_id": tenant,
        "run_id": f"{tenant}-run-{i % 16}",
        "step": i,
        "ts": time.time(),
        "producer": "benchmark",
        "seq": i,
    }
    if i % 3 == 0:
        return AlertFired(
            **env,
            alert_id=f"a{i}",
            detector="kl_blowup",
            layer="algorithmic",
            routing="page",
            window_start=i,
            window_end=i,
            observed={"kl_slope": 0.93},
            thresholds={"kl_slope_max": 0.3},
            config_version="v1",
            reason="KL to the reference rose 3x faster than the cap",
            first_response="lower the learning rate; check the reference model",
        )
    return RunStateChanged(
        **env, from_state="RUNNING", to_state="DEGRADED", reason="kl_blowup fired (page)"
    )


def anchor(receiver: WebhookReceiver, n: int) -> list[float]:
    """Plain signed POSTs of real bodies, one at a time, keep-alive: round trip seconds."""
    out = []
    with httpx.Client(trust_env=False) as client:
        for i in range(n):
            body = render(fact(i))
            ts = int(time.time())
            headers = {
                "Content-Type": "application/json",
                TIMESTAMP_HEADER: str(ts),
                SIGNATURE_HEADER: sign(SECRET, ts, body),
                DELIVERY_HEADER: f"anchor-{i}",
            }
            t0 = time.perf_counter()
            r = client.post(receiver.url("/anchor"), content=body, headers=headers)
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.status_code
    return out


#: fast retries; the receiver listens on loopback, which the notifier refuses by default
NOTIFY_FLAGS = ("--backoff-base-s", "0.2", "--allow-private-webhooks")


def notifier(log: Path, keys: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*CLI, "notify", "--log", str(log), "--keys", str(keys), *NOTIFY_FLAGS],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stream(
    log: Path, receiver: WebhookReceiver, n: int, rate: float, offset: int, kill_at: int | None
) -> tuple[dict[str, float], int, float]:
    """Append ``n`` facts at ``rate``/s; wait until each arrived; append time per id."""
    writer = EmbeddedLog(log)
    writer.open_sync()
    keys = log.parent / "keys.yaml"
    proc = notifier(log, keys)
    time.sleep(1.5)  # let it start (imports) before the clock runs
    cpu_start = cpu_s(proc.pid)
    sent: dict[str, float] = {}
    kills = 0
    try:
        t_next = time.perf_counter()
        for i in range(n):
            ev = fact(offset + i)
            writer.append_events_sync([ev])
            sent[str(ev.event_id)] = time.time()
            if kill_at is not None and i == kill_at:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                proc = notifier(log, keys)
            t_next += 1.0 / rate
            time.sleep(max(0.0, t_next - time.perf_counter()))
        end = time.monotonic() + 60
        while not set(sent) <= set(receiver.accepted) and time.monotonic() < end:
            time.sleep(0.05)
        cpu = cpu_s(proc.pid) - (cpu_start if not kills else 0.0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return sent, kills, cpu


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=600)
    parser.add_argument("--rate", type=float, default=100.0, help="facts appended per second")
    parser.add_argument("--anchor", type=int, default=600, help="plain POSTs for the anchor")
    parser.add_argument("--no-kill", dest="kill", action="store_false")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, WebhookReceiver(default_secret=SECRET) as rx:
        root = Path(tmp)
        keys = root / "keys.yaml"
        (root / "hook.secret").write_bytes(SECRET)
        hook = {"url": rx.url("/hook"), "secret_file": "hook.secret"}
        keys.write_text(
            yaml.safe_dump({"tenants": {"acme": {"webhook": hook}, "globex": {"webhook": hook}}})
        )
        plain = anchor(rx, args.anchor)
        sent, _, cpu = stream(root / "log", rx, args.events, args.rate, 0, None)
        arrived = {r.delivery_id: r.arrived for r in rx.received if r.status == 200}
        lat = [arrived[i] - t for i, t in sent.items() if i in arrived]
        missing = len(sent) - len(lat)
        a50, a99 = pct(plain, 0.5), pct(plain, 0.99)
        w50, w99 = pct(lat, 0.5), pct(lat, 0.99)
        print(f"webhook delivery, {len(sent)} facts at {args.rate:g}/s, loopback, embedded log:")
        print(
            f"  runwatch notify: p50 {w50 * 1e3:.1f} ms, p99 {w99 * 1e3:.1f} ms, "
            f"max {max(lat) * 1e3:.1f} ms (goal p99 < 1000 ms)"
            + (f"; {missing} NOT DELIVERED" if missing else "")
        )
        print(f"  notifier CPU after its start-up: {cpu / len(sent) * 1e3:.2f} ms per fact")
        print(f"  anchor, plain POST round trip: p50 {a50 * 1e3:.2f} ms, p99 {a99 * 1e3:.2f} ms")
        print(f"  ratio: p50 {w50 / a50:.0f}x, p99 {w99 / a99:.0f}x the plain POST")

        if args.kill:
            before = dict(rx.accepted)
            sent, kills, _ = stream(
                root / "log2", rx, args.events, args.rate, args.events, args.events // 2
            )
            accepted = {i: n for i, n in rx.accepted.items() if i not in before}
            lost = len(set(sent) - set(accepted))
            dup = sum(n - 1 for i, n in accepted.items() if i in sent)
            print(
                f"kill -9 mid-stream ({kills} kill, restarted at once): sent {len(sent)}, "
                f"delivered {len(set(sent) & set(accepted))}, duplicated {dup}, lost {lost} "
                f"(goal 0 lost)"
            )


if __name__ == "__main__":
    main()
