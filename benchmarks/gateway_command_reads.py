"""Many hooked runs of one tenant following their commands through the ingest gateway.

    python benchmarks/gateway_command_reads.py [--hooks 40] [--partitions 3] [--seconds 20]

The real ingest app (``runwatch.apps.ingest_app``, in process over ``httpx``'s ASGI
transport, the default per-tenant read rate) over an embedded log shown as
``--partitions`` partitions of the control topic (partition 0 holds every record, as a
key's one partition does); ``--hooks`` runs of one tenant, each with its own
``GatewayLog`` polling its run's commands every 0.5 s as a hook's reader does
(``producers.commands.read_to_end``). Figures: the polls refused (429: over the tenant's
read rate), the longest stretch a hook could not read its commands (a pause written then
is not seen), and the requests a poll makes. Anchor, same run: the client as it was
before 2026-11-28 (every partition, a scan for the end and another for the read), which
the review measured at 67 % refused and 56 s unread with 40 hooks on 3 partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from events.catalog.control import PauseRequested
from events.codec import encode
from events.log.base import Record
from events.log.embedded import EmbeddedLog
from producers.commands import read_to_end
from producers.hooks.gateway import GatewayLog
from projections.keys import ApiKeys
from runwatch.apps.ingest_app import create_app


def parted(partitions: int) -> type[EmbeddedLog]:
    class Parted(EmbeddedLog):
        """The embedded log as ``partitions`` partitions (0 holds every record)."""

        async def partitions(self, topic: str) -> list[int]:
            return list(range(partitions))

        async def end_offset(self, topic: str, partition: int = 0) -> int:
            return await super().end_offset(topic, 0) if partition == 0 else 0

        async def partition_of(self, topic: str, key: bytes) -> int | None:
            return 0

    return Parted


class BeforeGatewayLog(GatewayLog):
    """The anchor: the client before 2026-11-28 (all partitions, two scans a partition)."""

    async def partitions(self, topic: str) -> list[int]:
        return list((await self._get(f"/v1/ingest/{topic}/partitions"))["partitions"])

    async def read(  # type: ignore[override]
        self, topic: str, partition: int = 0, from_offset: int = 0, until_end: bool = True
    ) -> AsyncIterator[Record]:
        shown = self._shown.get((topic, partition))
        if shown is not None:
            shown.scanned_at = None  # always scan again
        async for rec in super().read(topic, partition, from_offset, until_end):
            yield rec


async def follow(client_cls: type[GatewayLog], hooks: int, parts: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        key = "k-" + uuid.uuid4().hex
        digest = hashlib.sha256(key.encode()).hexdigest()
        keys = ApiKeys.from_mapping({"keys": [{"sha256": digest, "tenant": "acme"}]})
        log = EmbeddedLog(root)
        await log.start()
        for i in range(hooks):  # each run has one command on the control topic
            ev = PauseRequested(
                event_id=uuid.uuid4(), tenant_id="acme", run_id=f"acme:r{i}", ts=time.time(),
                producer="operator/x", seq=i, actor="operator",
            )  # fmt: skip
            await log.append("runwatch.control", ev.key(), encode(ev))
        await log.close()
        app = create_app(lambda: parted(parts)(root), keys)
        counts = {"ok": 0, "refused": 0, "requests": 0}
        worst = [0.0] * hooks

        async def hook(i: int) -> None:
            transport = httpx.ASGITransport(app=app)

            class Counting(client_cls):  # type: ignore[valid-type,misc]
                async def _get(self, path: str, params: Any = None) -> Any:
                    counts["requests"] += 1
                    return await super()._get(path, params)

            gw = Counting("http://gw", key, timeout_s=5.0, only_key=f"acme:r{i}",
                          transport=transport)  # fmt: skip
            await gw.start()
            positions: dict[int, int] = {}
            last_ok = time.monotonic()
            end = last_ok + seconds
            while time.monotonic() < end:
                try:
                    await read_to_end(gw, "runwatch.control", positions)
                    counts["ok"] += 1
                    last_ok = time.monotonic()
                except ConnectionError:
                    counts["refused"] += 1
                    worst[i] = max(worst[i], time.monotonic() - last_ok)
                await asyncio.sleep(0.5)
            worst[i] = max(worst[i], time.monotonic() - last_ok)
            await gw.close()

        async with app.router.lifespan_context(app):
            await asyncio.gather(*(hook(i) for i in range(hooks)))
    polls = counts["ok"] + counts["refused"]
    return {
        "refused_pct": 100.0 * counts["refused"] / max(polls, 1),
        "longest_unread_s": max(worst),
        "requests_per_poll": counts["requests"] / max(polls, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hooks", type=int, default=40)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    rows = [
        ("before 2026-11-28 (anchor)", BeforeGatewayLog),
        ("now: the key's partition, one scan", GatewayLog),
    ]
    print(f"{args.hooks} hooked runs of one tenant, {args.partitions} partitions, "
          f"{args.seconds:g} s, a poll every 0.5 s")  # fmt: skip
    print(f"{'client':38s} {'polls refused':>13s} {'longest unread':>15s} {'requests/poll':>14s}")
    for name, cls in rows:
        r = asyncio.run(follow(cls, args.hooks, args.partitions, args.seconds))
        print(f"{name:38s} {r['refused_pct']:12.0f}% {r['longest_unread_s']:14.1f}s "
              f"{r['requests_per_poll']:14.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
