"""``runwatch log``: the embedded log as an audit artifact.

- ``runwatch log export --topic T [--topic T2 ...] --to DIR [--kafka HOST:PORT]`` copies
  Kafka topics into an embedded log directory (``--topic all``: every registered topic).
  Partitions are merged by record timestamp; each partition's own order (hence each
  run's order) is kept exactly.
- ``runwatch log export --from LOG --to DIR [--topic T ...]`` copies an embedded log
  (default: all its topics) record by record, append times kept, so the copy reads and
  replays exactly as the source. ``LOG`` is opened read-only: a torn tail is skipped and
  reported, never repaired — the copy is the clean one, the source stays as it was.
- ``runwatch log cat DIR [--topic T] [--json]`` prints the records, one JSON object per
  line with ``--json``. Undecodable records print as their dead letter; nothing is
  skipped silently. The directory is opened read-only: ``cat`` never repairs nor writes
  anything; a torn tail is skipped and reported on stderr (topic, offset, bytes) and, with
  ``--json``, as a last ``{"torn_tail": {...}}`` line per topic.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
from pathlib import Path

from events.codec import decode
from events.dead_letter import DeadLetter
from events.log.base import Record
from events.log.embedded import EmbeddedLog
from events.log.segments import NO_KEY, TornTail
from events.topics import DEAD_LETTER_TOPIC, TOPICS
from runwatch import settings
from runwatch.cli.terminal import Abort, Terminal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="log_command", metavar="SUBCOMMAND", required=True)
    exp = sub.add_parser("export", help="copy Kafka topics (or an embedded log) into a new log")
    exp.add_argument("--topic", action="append", help="topic name, or 'all' (required for Kafka)")
    exp.add_argument("--to", required=True, help="embedded log directory to write")
    exp.add_argument("--kafka", help="bootstrap servers (default: env or `runwatch kafka up`)")
    exp.add_argument(
        "--from",
        dest="source",
        metavar="LOG",
        help="copy this embedded log (opened read-only) instead of Kafka topics",
    )
    exp.add_argument("--json", action="store_true", help="print the summary as JSON")
    cat = sub.add_parser("cat", help="print the records of an embedded log")
    cat.add_argument("dir", help="embedded log directory")
    cat.add_argument("--topic", action="append", help="only these topics (default: all)")
    cat.add_argument("--json", action="store_true", help="one JSON object per line")


def run(args: argparse.Namespace, term: Terminal) -> int:
    if args.log_command == "export":
        return _export(args, term)
    return _cat(args, term)


def open_readonly(path: str | Path, topics: list[str] | None = None) -> EmbeddedLog:
    """An embedded log opened for reading only (an ``Abort`` when there is none, or a
    topic in ``topics`` is missing)."""
    log = EmbeddedLog(path, readonly=True)
    try:
        log.open_sync()
    except FileNotFoundError as exc:
        raise Abort(str(exc)) from None
    missing = [t for t in topics or [] if t not in log.topic_names()]
    if missing:
        raise Abort(f"no topic {', '.join(missing)} in {path}")
    return log


def warn_torn(tails: list[TornTail], term: Terminal) -> None:
    """Say on stderr what a read skipped and left in place."""
    for tail in tails:
        term.warn(tail.describe())


def _cat(args: argparse.Namespace, term: Terminal) -> int:
    log = open_readonly(args.dir, args.topic)
    topics = args.topic or log.topic_names()
    tails = log.torn_tails(topics)
    warn_torn(tails, term)
    bad = 0
    for rec in log.iter_records(topics):
        result = decode(rec.value)
        if isinstance(result, DeadLetter):
            bad += 1
            result = result.located(rec.topic, rec.partition, rec.offset)
            if args.json:
                term.json({"dead_letter": result.model_dump(mode="json")})
            else:
                term.info(f"{rec.topic}@{rec.offset} DEAD LETTER {result.kind}: {result.reason}")
        elif args.json:
            term.out.write(result.model_dump_json() + "\n")
        else:
            term.info(
                f"{rec.topic}@{rec.offset} {result.type} run={result.run_id} "
                f"step={result.step} tenant={result.tenant_id}"
            )
    if args.json:
        for tail in tails:
            term.json({"torn_tail": tail.as_dict()})
    if bad:
        term.warn(f"{bad} record(s) did not decode (printed as dead letters)")
    return 0


def _export(args: argparse.Namespace, term: Terminal) -> int:
    if args.source is not None:
        return _export_embedded(args, term)
    if not args.topic:
        raise Abort("--topic is required (a topic name, or 'all') when exporting from Kafka")
    bootstrap = settings.kafka_bootstrap(args.kafka)
    if not bootstrap:
        raise Abort(
            "no Kafka broker: pass --kafka, set KAFKA_BOOTSTRAP_SERVERS or `runwatch kafka up`"
        )
    topics = sorted(TOPICS) if "all" in args.topic else args.topic
    counts = asyncio.run(export(bootstrap, topics, args.to))
    if args.json:
        term.json({"bootstrap": bootstrap, "to": args.to, "records": counts})
    else:
        for topic, n in counts.items():
            term.info(f"{topic}: {n} records -> {args.to}")
    return 0


def _export_embedded(args: argparse.Namespace, term: Terminal) -> int:
    if args.kafka:
        raise Abort("--from copies an embedded log: leave out --kafka")
    wanted = None if not args.topic or "all" in args.topic else args.topic
    source = open_readonly(args.source, wanted)
    topics = wanted or source.topic_names()
    tails = source.torn_tails(topics)
    warn_torn(tails, term)
    counts = export_embedded(source, topics, args.to)
    if args.json:
        term.json(
            {
                "from": args.source,
                "to": args.to,
                "records": counts,
                "torn_tails": [t.as_dict() for t in tails],
            }
        )
    else:
        for topic, n in counts.items():
            term.info(f"{topic}: {n} records -> {args.to}")
    return 0


def export_embedded(source: EmbeddedLog, topics: list[str], to: str | Path) -> dict[str, int]:
    """Copy ``topics`` of the (read-only) ``source`` into a new embedded log at ``to``,
    record by record with their keys and append times: the copy merges and replays in
    the source's order. What a reader skips (a torn tail) is not copied."""
    src, dst = source.root.resolve(), Path(to).resolve()
    if dst == src or src in dst.parents:
        raise Abort(f"{to} is inside the log it would copy ({source.root}): pick another place")
    target = EmbeddedLog(to)
    if target.topic_names():
        raise Abort(f"{to} already holds an embedded log; export into a new directory")
    target.open_sync()
    counts = {}
    for topic in topics:
        counts[topic] = 0
        for chunk in source.raw_chunks(topic):
            target.append_many_sync(topic, [(k, v) for _, _, k, v in chunk], [r[0] for r in chunk])
            counts[topic] += len(chunk)
    return counts


async def export(bootstrap: str, topics: list[str], to: str) -> dict[str, int]:
    """Copy ``topics`` from Kafka into a new embedded log at ``to``; records per topic.

    Every record keeps its key, bytes and Kafka timestamp (as the embedded append time,
    made strictly increasing in merged order), so a replay of the export folds the topics
    in the order the broker recorded them. Each partition's own order is kept exactly.
    Refuses a ``to`` that already holds a log (an export twice would duplicate it).
    """
    from events.log.kafka import KafkaLog  # lazily: aiokafka only for export

    target = EmbeddedLog(to)
    if target.topic_names():
        raise Abort(f"{to} already holds an embedded log; export into a new directory")
    target.open_sync()
    streams = []
    async with KafkaLog(bootstrap) as kafka:
        for topic in topics:
            for p in await kafka.partitions(topic):
                streams.append([r async for r in kafka.read(topic, p, 0, until_end=True)])
    merged = heapq.merge(*streams, key=lambda r: (r.timestamp_ms, r.topic, r.partition, r.offset))
    by_topic: dict[str, tuple[list[tuple[bytes | None, bytes]], list[int]]] = {}
    last_ns = 0
    for rec in merged:
        last_ns = max(rec.timestamp_ms * 1_000_000, last_ns + 1)
        topic, item = rec.topic, (rec.key, rec.value)
        if rec.key is not None and len(rec.key) >= NO_KEY:  # beyond the embedded log's keys
            topic, item = DEAD_LETTER_TOPIC, (None, _key_too_long(rec).encode())
        records, stamps = by_topic.setdefault(topic, ([], []))
        records.append(item)
        stamps.append(last_ns)
    counts = {topic: 0 for topic in topics}
    for topic, (records, stamps) in by_topic.items():
        target.append_many_sync(topic, records, stamps)
        counts[topic] = len(records)
    return counts


def _key_too_long(rec: Record) -> DeadLetter:
    """The dead letter of a Kafka record whose key the embedded log cannot hold (Kafka
    takes keys of MiBs; no runwatch event has one: ids are at most 256 characters). The
    value is kept whole; the key by its length and digest."""
    digest = hashlib.sha256(rec.key or b"").hexdigest()
    return DeadLetter(
        kind="key_too_long",
        reason=(
            f"a record key of {len(rec.key or b'')} bytes (sha256 {digest}) is beyond the "
            f"embedded log's {NO_KEY - 1}: the value is kept here, the key is not"
        ),
        raw=rec.value,
        source_topic=rec.topic,
        source_partition=rec.partition,
        source_offset=rec.offset,
    )


__all__ = ["add_arguments", "export", "export_embedded", "open_readonly", "run", "warn_torn"]
