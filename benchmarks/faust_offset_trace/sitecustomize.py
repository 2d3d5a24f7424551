"""Offset trace of a faust worker: what it fetched, folded, committed and called a gap.

Loaded by the interpreter at start (``sitecustomize``) in the workers that
``benchmarks/worker_recovery.py --trace-offsets`` starts (it puts this directory first on
their ``PYTHONPATH``), and only when ``$RUNWATCH_FAUST_TRACE`` names the file to append
to. Nothing in runwatch imports it. It wraps, in faust-streaming 0.15 and runwatch's faust
agent:

- ``Consumer.getmany``: every record of the input topic drained from the fetcher
  (``DRAIN partition offset roff=<faust's read offset then>``);
- ``faust_agent.fold_records``: every record the agent folded (``FOLD partition offset``);
- ``Consumer._commit_offsets``: every commit (``COMMIT {"partition": offset}``, JSON);
- ``Consumer._add_gap``: every offset range faust treats as a gap, i.e. acknowledged
  without a record (``GAP tp from..to committed=<offset>``);
- ``Consumer.perform_seek``: the seek to the committed offsets after an assignment.

One line per fact: ``<pid> <unix time> <fact>``. ``read_trace`` in
``worker_recovery.py`` reads the file back: an offset below a committed offset that no
worker ever folded was committed past without being processed (lost).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

TOPIC = "runwatch.telemetry"


def _install(path: str) -> None:
    import faust.transport.consumer as fc

    import runwatch.hosting.faust_agent as fa

    out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    pid = os.getpid()

    def note(fact: str) -> None:
        out.write(f"{pid} {time.time():.3f} {fact}\n")

    fold_records = fa.fold_records

    def traced_fold(
        hosted: Any, topic: str, partition: int, offset: int, raw: bytes, *rest: Any
    ) -> Any:
        if topic == TOPIC:
            note(f"FOLD {partition} {offset}")
        return fold_records(hosted, topic, partition, offset, raw, *rest)

    fa.fold_records = traced_fold

    getmany = fc.Consumer.getmany

    async def traced_getmany(self: Any, timeout: float) -> Any:
        async for tp, message in getmany(self, timeout):
            if tp.topic == TOPIC:
                note(f"DRAIN {tp.partition} {message.offset} roff={self._read_offset.get(tp)}")
            yield tp, message

    fc.Consumer.getmany = traced_getmany

    commit = fc.Consumer._commit_offsets

    async def traced_commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> Any:
        ours = {tp.partition: o for tp, o in offsets.items() if tp.topic == TOPIC}
        note(f"COMMIT {json.dumps(ours)}")
        return await commit(self, offsets, start_new_transaction)

    fc.Consumer._commit_offsets = traced_commit

    add_gap = fc.Consumer._add_gap

    async def traced_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> Any:
        if tp.topic == TOPIC:
            note(f"GAP {tp.partition} {offset_from}..{offset_to} "
                 f"committed={self._committed_offset[tp]}")  # fmt: skip
        return await add_gap(self, tp, offset_from, offset_to)

    fc.Consumer._add_gap = traced_gap

    perform_seek = fc.Consumer.perform_seek

    async def traced_seek(self: Any) -> Any:
        note("SEEK start")
        result = await perform_seek(self)
        ours = {tp.partition: o for tp, o in self._committed_offset.items() if tp.topic == TOPIC}
        note(f"SEEK done committed={ours}")
        return result

    fc.Consumer.perform_seek = traced_seek
    note("traced")


if os.environ.get("RUNWATCH_FAUST_TRACE"):
    try:
        _install(os.environ["RUNWATCH_FAUST_TRACE"])
    except Exception as exc:  # a trace must never stop the worker it watches
        print(f"faust offset trace not installed: {exc!r}", file=sys.stderr)
