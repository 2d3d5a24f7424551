"""Snapshots of a trajectory API instance: restart without replaying the whole partition.

:class:`Snapshots` is mixed into :class:`runwatch.apps.trajectories.TrajectoryHost`: at a
record boundary it captures the fold state, the view and the payload index (the fold state
is immutable, the view and index are copied, so the capture is consistent), writes them
atomically in a thread, and on start resumes from the last one if it belongs to this log.
Time: the wall clock of the host's event loop decides when one is due (never a fold).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import zlib
from pathlib import Path
from typing import Any

from events.catalog.trajectory import TRAJECTORIES_TOPIC
from events.log.segments import write_atomically

log = logging.getLogger("runwatch.apps.trajectories")


class Snapshots:
    """The snapshot side of :class:`~runwatch.apps.trajectories.TrajectoryHost`."""

    settings: Any
    snapshot_path: Path | None
    partition: int | None
    position: int
    ready_offset: int
    start_offset: int
    resumed_from: int | None
    view: Any
    hosted: Any
    backend: Any
    state: Any
    _since_snapshot: int
    _snapshot_at: float
    _snapshot_task: asyncio.Task[None] | None
    _last_value: bytes

    def _snapshot_due(self) -> bool:
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return False
        if self._since_snapshot >= self.settings.snapshot_every_records:
            return True
        elapsed = asyncio.get_running_loop().time() - self._snapshot_at
        return self._since_snapshot > 0 and elapsed >= self.settings.snapshot_every_s

    def _snapshot(self) -> None:
        """Capture fold state, view and payload index at the current record boundary
        (synchronously: the fold state is immutable, the view and index are copied, so
        it is consistent), then encode and write it atomically in a thread."""
        assert self.snapshot_path is not None
        snap = {
            "tenant_id": self.settings.tenant_id,
            "run_id": self.settings.run_id,
            "partition": self.partition,
            "offset": self.position,
            "last_crc": zlib.crc32(self._last_value),
            "view": self.view.dump(),
            "payloads": self.view.payloads.dump_index(),
        }
        state, path, fold = self.state, self.snapshot_path, self.hosted.fold

        def encode_and_write() -> None:
            snap["fold"] = fold.dump_state(state).decode()
            write_atomically(path, json.dumps(snap, separators=(",", ":")).encode())

        self._since_snapshot = 0
        self._snapshot_at = asyncio.get_running_loop().time()
        self._snapshot_task = asyncio.create_task(asyncio.to_thread(encode_and_write))

    async def _resume(self) -> None:
        """Start from this instance's last snapshot if it belongs to this log: same run,
        same partition, not past the start marker, and the record just before its offset
        is the one it last folded (a recreated log fails that check)."""
        path = self.snapshot_path
        if path is None:
            return
        if not path.exists():
            self.view.payloads.load_index({"entries": {}})  # no snapshot: stale files go
            return
        try:
            snap = json.loads(path.read_bytes())
            offset = int(snap["offset"])
            fits = (
                snap["tenant_id"] == self.settings.tenant_id
                and snap["run_id"] == self.settings.run_id
                and snap["partition"] == self.partition
                and offset <= self.ready_offset
                and snap["payloads"] is not None
                and (offset == 0 or await self._crc_at(offset - 1) == snap["last_crc"])
            )
            if fits:
                self.state = self.hosted.fold.load_state(snap["fold"].encode())
                self.view.load(snap["view"])
                self.view.payloads.load_index(snap["payloads"])
                self.start_offset = self.resumed_from = offset
                return
            log.warning("snapshot %s does not match this log; replaying from 0", path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable snapshot %s (%s); replaying from 0", path, exc)
        self.state = self.hosted.fold.initial()
        self.view.reset()
        self.view.payloads.load_index({"entries": {}})

    async def _crc_at(self, offset: int) -> int | None:
        records = self.backend.read(TRAJECTORIES_TOPIC, self.partition or 0, offset)
        async with contextlib.aclosing(records) as it:  # type: ignore[type-var]
            async for rec in it:
                return zlib.crc32(rec.value) if rec.offset == offset else None
        return None
