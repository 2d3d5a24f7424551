"""One tenant's flood of notifications against another tenant's page (the notifier host).

    python benchmarks/notifier_flood.py [--flood 20000] [--repeat 3]

The real notifier (``runwatch.notifier.Notifier``, as ``runwatch notify`` runs it) on a
real embedded log, with real signed webhooks on loopback. Tenant acme's one run holds
``--flood`` state changes (what ``runwatch process`` derives one for one from acme's own
hook flapping ``RunPaused``/``RunResumed``), its webhook answering 503; then tenant
globex's run is paused by a gate. The figure: seconds from the notifier's start until
globex's webhook receives its page. Anchors, same run: the same with no flood (globex's
one fact alone), and with the same number of acme's facts spread one per run (what
reading and queueing that many facts costs any notifier). Best of ``--repeat`` each.

Before ``MAX_PENDING`` (``stream_processors/notify/fold.py``) the run's pending grew with
every fact and each fact scanned and copied all of it: 20,000 delayed globex's page 13.4 s
against 0.02 s (review, 2026-11-28).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import RunStateChanged
from events.log.embedded import EmbeddedLog
from runwatch.notifier import Notifier, NotifierSettings, WebhookBook
from runwatch.notifier_receiver import WebhookReceiver
from tests.integration.test_notifier import SECRETS, keys_file


def _change(tenant: str, run: str, i: int, to: str) -> RunStateChanged:
    return RunStateChanged(
        event_id=uuid.uuid4(), tenant_id=tenant, run_id=run, step=i, ts=time.time(),
        producer="projections/run-state", seq=i,
        from_state="RUNNING" if to != "RUNNING" else "PAUSED_BY_GATE", to_state=to,
        reason="paused by the customer",
    )  # fmt: skip


async def _page_latency(flood: int, tmp: Path, runs: int = 1) -> tuple[float, int]:
    """Seconds until globex's page arrives, and how many notifications acme's run holds."""
    got: dict[str, float] = {}

    def answer(rec):  # type: ignore[no-untyped-def]
        if rec.path == "/globex":
            got.setdefault("t", time.monotonic())
            return 200
        return 503

    secrets = {"/acme": SECRETS["acme"], "/globex": SECRETS["globex"]}
    with WebhookReceiver(secrets=secrets, answer=answer) as rx:
        keys = keys_file(tmp, {"acme": rx.url("/acme"), "globex": rx.url("/globex")})
        log = EmbeddedLog(tmp / "log", sync=False)
        log.open_sync()
        flaps = [
            _change(
                "acme", f"acme:flap-{i % runs}", i, "PAUSED_BY_GATE" if i % 2 == 0 else "RUNNING"
            )
            for i in range(flood)
        ]
        for i in range(0, len(flaps), 5000):
            log.append_events_sync(flaps[i : i + 5000])
        log.append_events_sync([_change("globex", "globex:prod", 1, "PAUSED_BY_GATE")])
        notifier = Notifier(
            EmbeddedLog(tmp / "log"),
            WebhookBook(keys),
            settings=NotifierSettings(state_path=tmp / "state.json", allow_private=True),
        )
        stop = asyncio.Event()
        await notifier.backend.start()
        t0 = time.monotonic()
        task = asyncio.create_task(notifier.run(stop))
        while "t" not in got and time.monotonic() - t0 < 300 and not task.done():
            await asyncio.sleep(0.01)
        latency = got.get("t", float("nan")) - t0
        held = notifier.pending()
        stop.set()
        await asyncio.wait_for(task, 60)
        await notifier.backend.close()
    return latency, held


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cases = [
        ("no flood (anchor)", 0, 1),
        (f"{args.flood:,} facts over {args.flood:,} runs (reading them)", args.flood, args.flood),
        (f"{args.flood:,} facts on one run (the attack)", args.flood, 1),
    ]
    rows = []
    for name, flood, runs in cases:
        got = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                got.append(asyncio.run(_page_latency(flood, Path(tmp), runs)))
        rows.append((name, min(r[0] for r in got), max(r[1] for r in got)))
    anchor, reading = rows[0][1], rows[1][1]
    print(f"{'acme before globex':52s} {'globex page s':>13s} {'x anchor':>9s} "
          f"{'x reading':>9s} {'acme pending':>12s}")  # fmt: skip
    for name, latency, held in rows:
        print(f"{name:52s} {latency:13.3f} {latency / anchor:9.1f} {latency / reading:9.2f} "
              f"{held:12d}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
