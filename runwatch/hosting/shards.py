"""One shard of a replay: the processors' and the read model's hosts over one read of a log.

:func:`run_shard` reads an embedded log once (merged in the log's deterministic order),
decodes each record once, and feeds the processors' host (:class:`~runwatch.hosting.host.
Host` with their folds, nothing persisted) and the read model's host
(:func:`~runwatch.hosting.read_model.read_model_host`). With ``workers`` > 1 it folds only
the runs whose key hashes to its shard (:func:`shard_of`: ``crc32(run_id) % workers``, the
way Kafka spreads keys over partitions), reading the barrier topics whole so the barrier's
watermarks move exactly as one process's do (other runs' barrier facts are decoded, not
applied). :mod:`runwatch.hosting.replay` runs the shards and merges them.

Per record a shard reads and checksums the whole log, decodes its own runs' records and
every barrier-topic record, and folds its own runs' only: with W free cores the wall time
of a replay is about read + barrier decode + (decode + fold) / W.

Derived events of a shard that reports them are tagged ``(fold index, source, rank)``:
the merge key of the record that derived them (the same in every shard, whatever its key
filter: :meth:`~events.log.embedded.EmbeddedLog.merged_chunks`) and, for a run released at
the barrier, its ``(held time, run id)``. Sorted by tag, the shards' outputs are exactly
what one process derives, in the same order.
"""

from __future__ import annotations

import gc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from events.codec import encode
from events.envelope import EventBase
from events.fast_decode import decode_many
from events.fold import Fold
from runwatch.hosting.barrier import BARRIER_TOPICS
from runwatch.hosting.host import Host
from runwatch.hosting.read_model import read_model_host
from runwatch.hosting.stores import NoState

#: The source of what the forced release at the end of a replay derives (after every record).
END = (float("inf"), "", 0)


def shard_of(key: bytes | None, workers: int) -> int:
    """The worker that folds a record with this key (no key: worker 0)."""
    return zlib.crc32(key) % workers if key else 0


class _Passes(dict[bytes | None, bool]):
    """The read filter of a shard's own topics: key -> "may it be this shard's?", once per
    distinct key (``__getitem__`` is a C-level dict lookup per record). A record without
    a key passes (its run id decides after decoding)."""

    def __init__(self, shard: int, workers: int) -> None:
        super().__init__()
        self[None] = True
        self.shard, self.workers = shard, workers

    def __missing__(self, key: bytes | None) -> bool:
        mine = self[key] = shard_of(key, self.workers) == self.shard
        return mine


@dataclass(frozen=True)
class Job:
    """What one shard replays (picklable: it crosses into a worker process)."""

    log_dir: str
    processors: tuple[Fold[Any], ...] = ()
    projections: bool = True
    policy: Any = None
    prices: Any = None
    shard: int = 0
    workers: int = 1
    #: per topic, where to stop (None: the log's current end)
    ends: dict[str, int] | None = None
    commit_every: int = 50_000
    collect: bool = True
    force_release: bool = True
    #: the shard's own SQLite file (None: in memory, or the store the caller passes)
    sqlite_out: str | None = None


@dataclass
class Shard:
    """A shard's hosts after its run, and what they derived."""

    processors: Host | None
    projection: Host | None
    records: int = 0
    reached: dict[str, int] = field(default_factory=dict)
    #: projection derived, in order (when collected)
    derived: list[EventBase] = field(default_factory=list)
    #: processors' derived, in order (tagged runs only; else each fold's ``emitted``)
    processed: list[EventBase] = field(default_factory=list)
    #: tagged derived of every host: (tag, encoded event) — only for ``workers`` > 1
    tagged: list[tuple[Any, bytes]] = field(default_factory=list)


def _owns(shard: int, workers: int) -> Callable[[bytes | None], bool] | None:
    if workers == 1:
        return None

    def owns(key: bytes | None) -> bool:
        return shard_of(key, workers) == shard

    return owns


def run_shard(job: Job, store: Any = None) -> Shard:
    """Replay ``job`` (into ``store`` when given: a read model to resume, for one shard)."""
    from events.log.embedded import EmbeddedLog

    gc_was_enabled = gc.isenabled()
    # The cyclic GC is paused for the replay: views, fold states and events form no
    # reference cycles (reference counting frees them), and the collector's repeated scans
    # of millions of live series points cost a third of the replay's CPU time.
    gc.disable()
    try:
        out = _hosts(job, store)
        proc, proj = out.processors, out.projection
        hosts = [h for h in (proc, proj) if h is not None]
        tagging = job.workers > 1 and job.collect
        topics = sorted({t for h in hosts for t in h.folds.topics})
        starts = {t: 0 for t in topics}
        floors: dict[str, int] = {}  # what the read model holds already: not handed to it
        if proj is not None:
            floors = {t: n for (t, _), n in proj.positions.items() if n}
            if proc is None:  # resuming a read model alone: start reading where it is
                starts.update({t: n for t, n in floors.items() if t in starts})
                floors = {}
        keys = None
        if job.workers > 1:
            passes = _Passes(job.shard, job.workers).__getitem__
            keys = {t: passes for t in topics if t not in BARRIER_TOPICS}
        log = EmbeddedLog(job.log_dir, readonly=True)
        chunks = log.merged_chunks(topics, starts, keys, job.ends, out.reached)
        for chunk in _batches(chunks, job.commit_every):
            out.records += _feed(hosts, chunk, out, tagging, job.collect, floors)
            if proj is not None:
                proj.checkpoint()
        if proj is not None and job.force_release:
            proj.source = END
            released = proj.release_held(force=True)
            if job.collect:
                out.derived.extend(released)
            proj.checkpoint()
        if tagging:  # (host: 0 processors, 1 read model; fold, source, rank)
            tagged = [
                ((0 if h is proc else 1, *tag), encode(ev))
                for h in hosts
                for tag, ev in zip(h.tags or (), _emitted(h, out), strict=True)
            ]
            out.tagged = sorted(tagged, key=lambda item: item[0])
        return out
    finally:
        if gc_was_enabled:
            gc.enable()


def _hosts(job: Job, store: Any) -> Shard:
    """The shard's hosts: the processors' (nothing kept) and the read model's."""
    from projections.sqlite_store import SqliteReadModel
    from projections.store import InMemoryReadModel

    owns = _owns(job.shard, job.workers)
    proc = proj = None
    if job.processors:
        proc = Host(list(job.processors), NoState(), owns=owns, collect=job.collect)
    if job.projections:
        if store is None:
            store = SqliteReadModel(job.sqlite_out) if job.sqlite_out else InMemoryReadModel()
        proj = read_model_host(store, job.policy, job.prices, owns=owns)
    if job.workers > 1 and job.collect:
        for h in (proc, proj):
            if h is not None:
                h.tags = []
    return Shard(proc, proj)


def _batches(chunks: Iterator[list[Any]], n: int) -> Iterator[list[Any]]:
    """The merged chunks regrouped into batches of ``n`` records (one commit each)."""
    records = (item for chunk in chunks for item in chunk)
    while batch := list(islice(records, n)):
        yield batch


def _feed(
    hosts: list[Host],
    chunk: list[Any],
    out: Shard,
    tagging: bool,
    collect: bool,
    floors: dict[str, int],
) -> int:
    """One batch through every host, decoded once; the records the read model took
    (``floors``: per topic, the offset below which the read model is not handed records,
    having folded them in an earlier replay)."""
    records = [item[3] for item in chunk]
    events = decode_many([r.value for r in records])
    sources = {id(r): item[:3] for r, item in zip(records, chunk)} if tagging else {}
    taken = 0
    for host in hosts:
        if floors and host is out.projection:
            pairs = [(r, e) for r, e in zip(records, events) if r.offset >= floors.get(r.topic, 0)]
            recs, evs = host.accept([r for r, _ in pairs], [e for _, e in pairs])
        else:
            recs, evs = host.accept(records, events)
        if host is out.projection:
            taken = len(recs)
        if not tagging:
            derived = host.process_decoded(recs, evs)
            if collect and host is out.projection:
                out.derived.extend(derived)
            continue
        into = out.derived if host is out.projection else out.processed
        for rec, ev in zip(recs, evs):
            host.source = sources[id(rec)]
            into.extend(host.process_decoded([rec], [ev]))
    if out.projection is None:
        return len(records)
    return taken


def _emitted(host: Host, shard: Shard) -> list[EventBase]:
    """Every event ``host`` put out in a tagged run, in the order of its tags."""
    return shard.derived if host is shard.projection else shard.processed


def export(shard: Shard) -> dict[str, Any]:
    """What a worker process hands back (picklable): counters, dead letters, the
    read model's runs (in memory) or nothing (its SQLite file holds them), the fleet,
    watermarks, the runs still held at the barrier, where each topic was read to, and the
    tagged derived events."""
    proj = shard.projection
    doc: dict[str, Any] = {
        "records": shard.records,
        "reached": shard.reached,
        "tagged": shard.tagged,
    }
    if proj is not None:
        from projections.store import InMemoryReadModel

        view = proj.view
        store = proj.store.read_model  # type: ignore[attr-defined]
        doc.update(
            applied=view.applied,  # type: ignore[union-attr]
            rejected_foreign=view.rejected_foreign,  # type: ignore[union-attr]
            projection_dead_letters=list(proj.dead_letters),
            fleet=view.fleet.to_doc(),  # type: ignore[union-attr]
            watermarks=proj.watermarks,
            # runs still held at the barrier (a replay without the forced release)
            held_runs=proj.barrier.to_doc()["runs"] if proj.barrier is not None else {},
            runs=store.runs_contents() if isinstance(store, InMemoryReadModel) else None,
        )
        store.close()
    return doc


def child(job: Job) -> dict[str, Any]:
    """A worker process's shard."""
    return export(run_shard(job))
