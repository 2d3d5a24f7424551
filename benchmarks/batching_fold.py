"""The trajectory batching fold at a growing backlog: is its cost per event flat?

The fold (``stream_processors.batching``) keeps a run's queue; every API instance folds
every accepted group and every ``/batch`` request. This measures, at backlogs of
``--backlogs`` queued groups (8 sequences each; ``batch_size`` 64):

- accept: the fold's time per ``ScoredDataGroupStored``; ``accept_keyed``: the same with
  an ``Idempotency-Key`` on every push of 25 groups (the fold checks and records each
  group's identity; the key map then holds backlog / 25 keys);
- request: its time per ``TrajectoryBatchRequested`` (a batch served), with no staleness
  limit and with ``max_off_policy_steps`` set (every group fresh);
- anchor, measured in the same run: copying a tuple of that many queued groups, which is
  what each accepted group cost while the queue was one tuple (before ``Backlog``).

Usage: ``python benchmarks/batching_fold.py [--backlogs 1000,10000,50000] [--json]``
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from events.catalog.trajectory import (
    ScoredDataGroupStored,
    TrajectoryBatchRequested,
    TrajectoryTrainerRegistered,
)
from events.envelope import EventBase
from stream_processors.batching import BatchingFold
from stream_processors.batching.fold import BatchingState
from stream_processors.batching.selection import Queued

_SEQ = iter(range(10**9))


def envelope() -> dict[str, object]:
    n = next(_SEQ)
    return {"event_id": uuid.UUID(int=n + 1), "tenant_id": "t", "run_id": "r",
            "ts": 1000.0 + n, "producer": "bench", "seq": n}  # fmt: skip


def registered(max_off_policy_steps: int | None) -> TrajectoryTrainerRegistered:
    return TrajectoryTrainerRegistered(
        **envelope(), requester_uuid="1", wandb_group="g", wandb_project="p", batch_size=64,
        max_token_len=4096, checkpoint_dir="/tmp", save_checkpoint_interval=10,
        starting_step=0, num_steps=10**6, max_off_policy_steps=max_off_policy_steps,
    )  # fmt: skip


def stored(i: int, keyed: bool = False) -> ScoredDataGroupStored:
    key = {"idempotency_key": f"push-{i // 25}", "key_index": i % 25, "dedupe_window": 10**5}
    return ScoredDataGroupStored(
        **envelope(), group_id=f"g{i}", num_sequences=8, payload_partition=0,
        payload_offset=i, payload_bytes=1, payload_crc=0, **(key if keyed else {}),
    )  # fmt: skip


def per_event(
    fold: BatchingFold, state: BatchingState, events: list[EventBase]
) -> tuple[BatchingState, float]:
    t0 = time.perf_counter()
    for ev in events:
        state, _ = fold.apply(state, ev)
    return state, (time.perf_counter() - t0) / max(1, len(events))


def measure(backlog: int, limit: int | None, probe: int = 1000) -> dict[str, object]:
    fold = BatchingFold()
    state, _ = fold.apply(fold.initial(), registered(limit))
    state, _ = per_event(fold, state, [stored(i) for i in range(backlog - probe)])
    state, accept_s = per_event(fold, state, [stored(backlog + i) for i in range(probe)])
    keyed, _ = fold.apply(fold.initial(), registered(limit))
    keyed, _ = per_event(fold, keyed, [stored(i, True) for i in range(backlog - probe)])
    _, keyed_s = per_event(fold, keyed, [stored(backlog + i, True) for i in range(probe)])
    requests: list[EventBase] = [
        TrajectoryBatchRequested(**envelope(), request_id=f"r{i}") for i in range(100)
    ]
    state, request_s = per_event(fold, state, requests)
    queue = tuple(Queued(f"g{i}", None, 8, 0, i) for i in range(backlog))
    t0 = time.perf_counter()
    for _ in range(100):
        _ = (*queue, queue[0])
    copy_s = (time.perf_counter() - t0) / 100
    return {
        "backlog": backlog,
        "max_off_policy_steps": limit,
        "accept_us": round(accept_s * 1e6, 2),
        "accept_keyed_us": round(keyed_s * 1e6, 2),
        "anchor_tuple_copy_us": round(copy_s * 1e6, 2),
        "request_ms": round(request_s * 1e3, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlogs", default="1000,10000,50000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(int(b), limit) for b in args.backlogs.split(",") for limit in (None, 1_000_000)]
    if args.json:
        print(json.dumps(rows))
        return 0
    cols = list(rows[0])
    print("  ".join(f"{c:>20}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]!s:>20}" for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
