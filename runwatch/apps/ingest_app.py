"""The ingest gateway: customers' hooks publish and follow their runs without broker access.

A hook inside a customer's training process holds an API key of its tenant, not Kafka
credentials. This app owns the log client and, for each request:

- ``POST /v1/ingest/{topic}`` (``{"records": [{"key": "run-1", "value": "<event JSON>"}]}``):
  every record judged by :func:`runwatch.apps.ingest_policy.admit` against the key's
  tenant; admitted ones appended in order (durable before the answer: Kafka acks=all, the
  embedded log's append), refused ones written to the dead-letter topic with the reason
  (nothing lost, nothing reaches a run). Answer: which records were appended (no offsets) and why
  each refused one was refused (``200`` either way: a refusal is the record's, not the
  request's; a retry of a refused record is refused again);
- ``GET /v1/ingest/{topic}/partitions[?key=RUN]`` (with ``key``, one of the tenant's
  runs: only the partition that key's records are appended to, by the log's own
  partitioner: a hook following its run reads one partition, not all of them; this
  assumes the control and lifecycle topics keep their partition count, as faust's
  co-partitioning already does — a topic given more partitions while hooks follow it
  must be followed by restarting the gateway and the hooks),
  ``.../partitions/{p}/records[?after=CURSOR][&key=RUN]``: the control and lifecycle
  topics only, records of the key's tenant only (of one run's key with ``key``: the others
  are skipped unread), scanning at most :data:`SCAN_BUDGET` records (:data:`KEY_SCAN_BUDGET`
  with ``key``) or a page of :data:`PAGE_BYTES` per request; ``next`` is a sealed cursor
  to go on from, ``at_end`` says whether the scan reached the end. No offset is shown (not
  of the records, not the end, not in a cursor: :mod:`runwatch.apps.ingest_cursor`): they
  would tell how many records other tenants wrote to these topics, and when. A cursor
  this gateway did not make for this tenant and partition (one from a gateway with
  another secret) answers ``410``: read from the start;
- ``GET /v1/ingest/whoami``: the key's tenant (a hook checks its key at start).

No key or an unknown one: ``401``; an operator key: ``403`` (operators command runs
through the query API). Each tenant may write ``record_burst`` records and
``byte_burst`` bytes at once, then ``record_rate`` and ``byte_rate`` a second, and make
``read_burst`` read tokens at once, then ``read_rate`` a second: beyond them ``429``
with ``Retry-After`` (the hook spools and retries). A read token is priced at about a
millisecond of the gateway's event loop: a read costs 1, plus one per
:data:`SCAN_COST` records it decoded and one per :data:`SKIP_COST` records it skipped
(:func:`scan_cost`). The scan's worst case is taken before it starts (so a burst cannot
queue more scans than the tenant's tokens pay for) and the unused part given back after;
the scan gives the event loop to the other requests every :data:`SLICE_S` seconds. A
record over :data:`~runwatch.apps.ingest_policy.MAX_RECORD_BYTES` is refused (its dead
letter keeps its first 64 KiB). Bodies need a valid key before a byte is read and stay
under :data:`MAX_BODY_BYTES` (:class:`projections.auth.KeyedBodies`). The log is opened
at startup and closed at shutdown; a log that fails a request answers ``503`` (the hook
spools and retries).
"""

# No ``from __future__ import annotations`` here: FastAPI evaluates the routes' annotations
# at runtime, and their ``Depends`` name functions local to :func:`create_app`.

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from events.dead_letter import DeadLetter
from events.log.base import LogBackend
from events.topics import DEAD_LETTER_TOPIC, TOPICS
from projections.api import CommandRate, take_or_429
from projections.auth import KeyedBodies, principal_of
from projections.keys import ApiKeys, Principal
from runwatch.apps.ingest_cursor import CursorRefused, CursorSeal
from runwatch.apps.ingest_policy import READABLE_TOPICS, RUN_SEPARATOR, admit, readable

#: The largest request body (a hook sends batches well under this: ``GatewayLog``).
MAX_BODY_BYTES = 4 << 20
#: Records in one request at most.
MAX_RECORDS = 5_000
#: Records one read request scans at most, and bytes of records one answer holds at most
#: (the caller goes on from ``next``).
SCAN_BUDGET, PAGE_BYTES = 5_000, 1 << 20
#: Records of one key (``?key=``: a run's own) one read request scans at most: skipping
#: another key's record is a byte comparison, not a decode (but still a record read:
#: :data:`SKIP_COST`). 50,000: ~125 ms of loop time and 126 read tokens at most (it was
#: 200,000, ~0.5 s: a request sharing the loop with others' scans must stay well inside
#: a hook's 5 s read timeout, and a hook goes on from ``next`` in the same read anyway).
KEY_SCAN_BUDGET = 50_000
#: What a hook from before sealed cursors (2026-11-28) is told when it asks for offsets.
UPGRADE = (
    "this gateway shows no offsets (sealed cursors since 2026-11-28): upgrade the runwatch "
    "hook in this process"
)
#: Each tenant's records written per second, and at once (a hook writes ~5 per step).
RECORD_RATE, RECORD_BURST = 5_000.0, 50_000
#: Each tenant's bytes written per second, and at once.
BYTE_RATE, BYTE_BURST = float(5 << 20), 50 << 20
#: Each tenant's read tokens per second, and at once (a hook polls ~6 a second, ~1 token
#: each). A token is priced at about 1 ms of the event loop (what the cheapest request
#: costs), so a tenant reading at its sustained rate takes ~10% of the loop.
READ_RATE, READ_BURST = 100.0, 1_000
#: Records decoded (a tenant check: JSON parsed) per read token, and records skipped
#: (another key's: read and compared) per read token. Measured 2026-11-28 on the 2-core
#: CI box (``/tmp/read-dos/calibrate.py``, median of 5 over 250k lifecycle records of
#: ~300 bytes): a skip 2.5 us, a decode 6.1 us of loop time, each with its share of the
#: log read; so 1 ms buys ~400 skips or ~160 decodes. (It used to be 1,000 decodes per
#: token and skips free: a 200k-record keyed scan, 0.3-0.6 s of loop time, cost 1 token.)
SCAN_COST, SKIP_COST = 160, 400
#: Seconds a scan runs before it gives the event loop to the other requests (checked
#: every :data:`SLICE_RECORDS` records).
SLICE_S, SLICE_RECORDS = 0.001, 32


def scan_cost(skipped: int, decoded: int) -> float:
    """Read tokens a read costs: 1 for the request, plus ``decoded`` records at
    :data:`SCAN_COST` a token and ``skipped`` ones at :data:`SKIP_COST` a token (records
    of another key than the one asked for: read and compared, not decoded)."""
    return 1.0 + decoded / SCAN_COST + skipped / SKIP_COST


class IngestRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str | None = Field(default=None, max_length=4096)
    value: str


class IngestBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    records: list[IngestRecord] = Field(max_length=MAX_RECORDS)


def create_app(
    open_log: Callable[[], LogBackend],
    keys: ApiKeys,
    *,
    record_rate: float = RECORD_RATE,
    record_burst: int = RECORD_BURST,
    byte_rate: float = BYTE_RATE,
    byte_burst: int = BYTE_BURST,
    read_rate: float = READ_RATE,
    read_burst: int = READ_BURST,
    cursor_secret: bytes | None = None,
) -> FastAPI:
    """The gateway over the log ``open_log()`` makes (opened at startup), for ``keys``,
    with each tenant's write and read limits (module docstring). A burst must hold one
    whole request (``record_burst`` >= :data:`MAX_RECORDS`, ``byte_burst`` >=
    :data:`MAX_BODY_BYTES`), or a full request would be charged only the burst.
    ``cursor_secret``: what seals read cursors (shared by the replicas serving the same
    hooks; ``None``: a fresh random one, so a restart sends readers back to the start)."""
    if record_burst < MAX_RECORDS or byte_burst < MAX_BODY_BYTES:
        raise ValueError(
            f"the record burst must be at least {MAX_RECORDS} and the byte burst at least "
            f"{MAX_BODY_BYTES} (one whole request)"
        )
    state: dict[str, LogBackend] = {}
    writes, reads = CommandRate(record_rate, record_burst), CommandRate(read_rate, read_burst)
    written = CommandRate(byte_rate, byte_burst)
    seal = CursorSeal(cursor_secret)

    def limited(bucket: CommandRate, tenant_id: str, n: float = 1.0) -> None:
        take_or_429(bucket, tenant_id, n, "over this tenant's rate: retry later")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        log = open_log()
        await log.start()
        state["log"] = log
        try:
            yield
        finally:
            await log.close()

    app = FastAPI(title="runwatch ingest gateway", version="1.0.0", lifespan=lifespan)
    app.add_middleware(KeyedBodies, keys=keys, max_bytes=MAX_BODY_BYTES)
    principal = principal_of(keys)

    async def tenant(who: Annotated[Principal, Depends(principal)]) -> str:
        if who.operator or not who.tenant_id:
            raise HTTPException(403, "a tenant's key is required (operators use the query API)")
        return who.tenant_id

    def log() -> LogBackend:
        return state["log"]

    @app.get("/v1/ingest/whoami")
    async def whoami(tenant_id: Annotated[str, Depends(tenant)]) -> dict[str, str]:
        return {"tenant_id": tenant_id}

    @app.post("/v1/ingest/{topic}")
    async def publish(
        topic: str, batch: IngestBatch, tenant_id: Annotated[str, Depends(tenant)]
    ) -> dict[str, Any]:
        if topic not in TOPICS:
            raise HTTPException(404, f"no topic {topic[:100]!r}")
        values = [rec.value.encode("utf-8", "surrogatepass") for rec in batch.records]
        limited(writes, tenant_id, len(values))
        limited(written, tenant_id, sum(map(len, values)))
        admitted: list[tuple[int, tuple[bytes | None, bytes]]] = []
        refused: list[tuple[int, DeadLetter]] = []
        for i, (rec, value) in enumerate(zip(batch.records, values, strict=True)):
            key = rec.key.encode() if rec.key is not None else None
            verdict = admit(tenant_id, topic, key, value)
            if isinstance(verdict, DeadLetter):
                refused.append((i, verdict.model_copy(update={"source_topic": topic})))
            else:
                admitted.append((i, (key, value)))
        try:
            if admitted:
                await log().append_many(topic, [r for _, r in admitted])
            if refused:
                letters = [(None, letter.encode()) for _, letter in refused]
                await log().append_many(DEAD_LETTER_TOPIC, letters)
        except Exception as exc:  # the log is away: the hook keeps the records and retries
            raise HTTPException(503, f"the log refused the write: {type(exc).__name__}") from None
        return {  # no offsets: where a record landed tells of other tenants' writes
            "appended": [i for i, _ in admitted],
            "refused": [
                {"index": i, "kind": letter.kind, "reason": letter.reason} for i, letter in refused
            ],
        }

    def readable_topic(topic: str, tenant_id: str) -> str:
        if topic not in READABLE_TOPICS:
            raise HTTPException(403, f"a hook reads only {sorted(READABLE_TOPICS)}")
        limited(reads, tenant_id)
        return topic

    @app.get("/v1/ingest/{topic}/partitions")
    async def partitions(
        topic: str,
        tenant_id: Annotated[str, Depends(tenant)],
        key: Annotated[str | None, Query(max_length=4096)] = None,
    ) -> dict[str, Any]:
        readable_topic(topic, tenant_id)
        if key is not None and not key.startswith(f"{tenant_id}{RUN_SEPARATOR}"):
            raise HTTPException(403, f"a hook reads its own runs' keys ({tenant_id}:...)")
        if key is not None:  # the one partition that key's records are appended to
            found = await _guarded(log().partition_of(topic, key.encode()))
            if found is not None:
                return {"partitions": [found]}
        return {"partitions": await _guarded(log().partitions(topic))}

    @app.get("/v1/ingest/{topic}/partitions/{partition}/end")
    async def end(topic: str, partition: int) -> dict[str, Any]:
        raise HTTPException(410, UPGRADE)  # a hook from before cursors asks for offsets

    @app.get("/v1/ingest/{topic}/partitions/{partition}/records")
    async def records(
        topic: str,
        partition: int,
        tenant_id: Annotated[str, Depends(tenant)],
        after: Annotated[str | None, Query(max_length=64)] = None,
        key: Annotated[str | None, Query(max_length=4096)] = None,
        start: int | None = None,
    ) -> dict[str, Any]:
        """The tenant's records from where the cursor ``after`` stopped (none: the start;
        ``key``: only that key's, a run's own), scanning until the end, the scan budget or
        a full page. ``next``: the cursor to go on from; ``at_end``: nothing more now."""
        readable_topic(topic, tenant_id)  # the request's token, whatever its answer
        if start is not None:
            raise HTTPException(410, UPGRADE)
        if partition < 0:
            raise HTTPException(422, "a partition is >= 0")
        if key is not None and not key.startswith(f"{tenant_id}{RUN_SEPARATOR}"):
            # another tenant's run: nothing of it is readable, and how long its records
            # take to skip would tell how many there are
            raise HTTPException(403, f"a hook reads its own runs' keys ({tenant_id}:...)")
        try:
            start = seal.open(after, tenant_id, topic, partition) if after is not None else 0
        except CursorRefused as exc:
            raise HTTPException(410, str(exc)) from None
        wanted = key.encode() if key is not None else None
        budget = KEY_SCAN_BUDGET if wanted is not None else SCAN_BUDGET
        end_offset = await _guarded(log().end_offset(topic, partition))
        # The scan's worst case, taken before it starts (every record skipped with a key,
        # decoded without; 429 if the tenant's tokens do not cover it) and settled after.
        # A key's own records are decoded at the dearer price: owed after, if any.
        most = min(budget, max(0, end_offset - start))
        worst = scan_cost(most, 0) if wanted is not None else scan_cost(0, most)
        reserved = min(worst, float(reads.burst)) - 1.0  # the request's 1 is taken
        limited(reads, tenant_id, reserved)
        out: list[dict[str, Any]] = []
        scanned, decoded, size, position = 0, 0, 0, start
        try:
            if start < end_offset:
                reading = log().read(topic, partition, start, until_end=True)
                slice_end = time.perf_counter() + SLICE_S
                async with contextlib.aclosing(reading):  # a Kafka reader closed at once
                    async for rec in reading:
                        position, scanned = rec.offset + 1, scanned + 1
                        if wanted is None or rec.key == wanted:
                            decoded += 1
                            if readable(tenant_id, rec.value):
                                out.append(_record(rec))
                                size += len(rec.value)
                        if scanned >= budget or size >= PAGE_BYTES or position >= end_offset:
                            break
                        if scanned % SLICE_RECORDS == 0 and time.perf_counter() >= slice_end:
                            await asyncio.sleep(0)  # the other requests' turn
                            slice_end = time.perf_counter() + SLICE_S
            else:
                position = max(start, end_offset)
        except Exception as exc:
            raise HTTPException(503, f"the log refused the read: {type(exc).__name__}") from None
        finally:  # what the scan cost, read or not (the request's 1 is already taken)
            reads.settle(tenant_id, reserved, scan_cost(scanned - decoded, decoded) - 1.0)
        return {
            "records": out,
            "next": seal.seal(position, tenant_id, topic, partition),
            "at_end": position >= end_offset,
        }

    return app


def _record(rec: Any) -> dict[str, Any]:
    return {
        "timestamp_ms": rec.timestamp_ms,
        "key": rec.key.decode("utf-8", "replace") if rec.key is not None else None,
        "value": rec.value.decode("utf-8", "surrogatepass"),
    }


async def _guarded(call: Any) -> Any:
    try:
        return await call
    except Exception as exc:
        raise HTTPException(503, f"the log refused the read: {type(exc).__name__}") from None
