"""A hook's log behind the ingest gateway: a :class:`LogBackend` over HTTP and a tenant key.

``RunwatchHook(..., gateway="https://runwatch.example/", api_key=...)`` (or
``$RUNWATCH_GATEWAY`` / ``$RUNWATCH_API_KEY``) publishes and follows its run through
``runwatch serve ingest`` (:mod:`runwatch.apps.ingest_app`) instead of holding broker
credentials in the customer's process. :class:`GatewayLog` is what the hook's publisher
writes to and its command reader reads from, so spooling, retries and the command
protocol are the same as on Kafka:

- ``append_many``: one ``POST`` per chunk of at most :data:`CHUNK_BYTES`. A transport
  error, a 5xx, a 429 (over the tenant's rate) or a 401/403 (a key the gateway does not
  take now: the keys file may be fixed) raises: the publisher spools and retries. What the
  gateway refuses for good is not retried, and said once in the log: a record it
  dead-lettered, a request it answers 404/413/422, a record over
  :data:`MAX_RECORD_BYTES` (not sent: it could never be). The gateway tells no offsets
  (they would tell of other tenants' writes): every ``Appended`` has -1;
- ``partitions`` / ``end_offset`` / ``read``: the gateway's answers for the control and
  lifecycle topics, the tenant's own records only. A client of one run's records
  (``only_key``) asks for that key's partition alone, and a ``read`` right after
  ``end_offset`` reuses its scan: a command poll is one request, not one plus two a
  partition (found by review: 40 hooked runs of one tenant spent its read rate, 67 % of
  their polls refused, commands unread up to 56 s). The gateway shows no offsets (they
  would tell how many records other tenants wrote, and when): it hands back a sealed
  cursor where each scan stopped. This client numbers the records it is shown 0, 1, 2...
  per partition, in log order, so its readers (the command feed, the lifecycle read at a
  restart) go on from ``offset + 1`` as on any log. It keeps the records its readers have
  not yet gone past, and the cursor where its last scan stopped, so following a run scans
  each stretch of the log once. A cursor the gateway no longer opens (``410``: it
  restarted with a new secret) sends the scan back to the start, once per read (a second
  in one read is an error: replicas that do not share ``--cursor-secret-file``); the same
  records get the same numbers (the log is append-only and the gateway's filter the
  same; records dropped by retention between two scans would shift them), and those
  already numbered are not shown again.
``start`` asks ``/v1/ingest/whoami``: a key the gateway does not know fails the start (the
publisher then spools and says why). Time semantics: none of its own (the events carry
theirs); every call waits at most ``timeout_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from events.log.base import Appended, LogBackend, LogConsumer, Record

log = logging.getLogger("runwatch.hooks")

#: The largest request body this client sends (the gateway takes up to 4 MiB).
CHUNK_BYTES = 1 << 20
#: The largest record the gateway takes (``runwatch.apps.ingest_policy.MAX_RECORD_BYTES``).
MAX_RECORD_BYTES = 512 << 10
#: Answers that refuse a request for good (a retry gets the same): not an outage.
FINAL_REFUSALS = frozenset({404, 413, 422})
#: The most records in one request (the gateway's own limit).
CHUNK_RECORDS = 5_000
#: A read this soon after a scan of its partition reached the end uses that scan (what
#: ``read_to_end`` does: ``end_offset``, then ``read``; one request, not two).
FRESH_S = 0.25
#: How long a topic's partitions (a key's partition) are taken as the gateway said.
PARTITIONS_TTL_S = 60.0


class GatewayRefused(Exception):
    """The gateway refused the request itself (a bad key, 4xx), or it is one the gateway
    does not serve by design (consumer groups, reads that stop short of the end)."""


class _CursorGone(Exception):
    """The gateway no longer opens a cursor it made (a restart with a new secret)."""


class _Shown:
    """What one client has been shown of one partition: its records numbered in log order,
    those its readers have not gone past, and the cursor where the scan stopped."""

    __slots__ = ("count", "cursor", "kept", "kept_from", "known", "scanned_at")

    def __init__(self) -> None:
        self.cursor: str | None = None
        self.count = 0  # the number the next record shown gets
        self.known = 0  # records numbered before a scan started again (not shown twice)
        self.kept: list[Record] = []
        self.kept_from = 0  # the number of the first record kept
        #: when the last scan reached the end (monotonic; None: none did yet)
        self.scanned_at: float | None = None

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes, ts: int) -> None:
        number, self.count = self.count, self.count + 1
        if number >= self.known:
            self.kept.append(Record(topic, partition, number, key, value, ts))

    def restart(self) -> None:
        """Scan from the start again, numbering as before."""
        self.cursor, self.known, self.count = None, max(self.known, self.count), 0

    def let_go(self, before: int) -> None:
        """A reader has gone on from ``before``: keep only the records from there."""
        if before > self.kept_from:
            self.kept = [r for r in self.kept if r.offset >= before]
            self.kept_from = before


class GatewayLog(LogBackend):
    """The log as the ingest gateway at ``url`` shows it to ``api_key``'s tenant."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout_s: float = 10.0,
        only_key: str | None = None,
        transport: Any = None,
    ) -> None:
        """``only_key``: read only that key's records (a run's own: the gateway skips the
        others unread). ``transport``: an ``httpx.AsyncBaseTransport`` to send through
        (a proxy of the customer's; default: httpx's own)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the gateway is an http(s) URL, not {url[:100]!r}")
        if not api_key:
            raise ValueError("the gateway needs an API key (api_key= or $RUNWATCH_API_KEY)")
        self.url = url.rstrip("/")
        self._key = api_key
        self.timeout_s = timeout_s
        self.only_key = only_key
        self.tenant_id: str | None = None
        self._client: Any = None
        self._transport = transport
        #: (topic, partition) -> what this client has been shown of it
        self._shown: dict[tuple[str, int], _Shown] = {}
        #: topic -> (when asked, its partitions as the gateway answered)
        self._partitions: dict[str, tuple[float, list[int]]] = {}
        self._said: set[str] = set()

    async def start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            base_url=self.url,
            transport=self._transport,
            headers={"Authorization": f"Bearer {self._key}"},
            timeout=self.timeout_s,
        )
        try:
            self.tenant_id = (await self._get("/v1/ingest/whoami"))["tenant_id"]
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- writing ---------------------------------------------------------------------
    async def append(self, topic: str, key: bytes | None, value: bytes) -> Appended:
        return (await self.append_many(topic, [(key, value)]))[0]

    async def append_many(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes]], *, spread: bool = False
    ) -> list[Appended]:
        sendable = [r for r in records if len(r[1]) <= MAX_RECORD_BYTES]
        if len(sendable) < len(records):
            self._say(
                "too-large",
                f"runwatch: {len(records) - len(sendable)} event(s) over {MAX_RECORD_BYTES} "
                f"bytes not sent to the gateway (it takes none that large)",
            )
        for chunk in _chunks(sendable):
            body = {
                "records": [
                    {"key": k.decode() if k is not None else None, "value": v.decode()}
                    for k, v in chunk
                ]
            }
            answer = await self._call("POST", f"/v1/ingest/{topic}", json=body, final_ok=True)
            if answer is None:
                continue  # refused for good (said once): never retried
            for r in answer["refused"]:
                self._say(r["kind"], f"runwatch: the gateway refused an event: {r['reason']}")
        return [Appended(topic, -1, -1)] * len(records)

    # -- reading (the control and lifecycle topics) -----------------------------------
    async def partitions(self, topic: str) -> list[int]:
        """The topic's partitions; with ``only_key``, the one the gateway appends that key's
        records to (by its log's own partitioner; a gateway from before that answers all
        of them). Asked again after :data:`PARTITIONS_TTL_S`."""
        cached = self._partitions.get(topic)
        if cached is not None and time.monotonic() - cached[0] < PARTITIONS_TTL_S:
            return list(cached[1])
        params = {"key": self.only_key} if self.only_key is not None else None
        found = list((await self._get(f"/v1/ingest/{topic}/partitions", params))["partitions"])
        self._partitions[topic] = (time.monotonic(), found)
        return found

    async def end_offset(self, topic: str, partition: int) -> int:
        """One past the number of the last of the tenant's records (this client's numbers)."""
        return (await self._scan(topic, partition)).count

    async def read(  # type: ignore[override]
        self, topic: str, partition: int = 0, from_offset: int = 0, until_end: bool = True
    ) -> AsyncIterator[Record]:
        if not until_end:
            raise GatewayRefused("the gateway serves reads up to the end only (by design)")
        shown = self._shown.get((topic, partition))
        if shown is not None and from_offset < shown.kept_from:  # let go of: scan again
            del self._shown[(topic, partition)]
            shown = None
        fresh = (
            shown is not None
            and shown.scanned_at is not None
            and time.monotonic() - shown.scanned_at < FRESH_S
        )
        if not fresh:  # (a read right after end_offset's scan: that scan's records)
            shown = await self._scan(topic, partition)
        assert shown is not None
        for rec in list(shown.kept):
            if rec.offset >= from_offset:
                yield rec
        shown.let_go(from_offset)

    async def _scan(self, topic: str, partition: int) -> _Shown:
        """Scan on from where the last scan stopped to the end; number what is shown."""
        shown = self._shown.setdefault((topic, partition), _Shown())
        path = f"/v1/ingest/{topic}/partitions/{partition}/records"
        restarted = False
        while True:
            params: dict[str, Any] = {}
            if shown.cursor is not None:
                params["after"] = shown.cursor
            if self.only_key is not None:
                params["key"] = self.only_key
            try:
                page = await self._get(path, params=params)
            except _CursorGone as gone:
                if restarted:  # twice in one scan: replicas sealing with different secrets
                    raise ConnectionError(
                        "the gateway refused its own cursor twice in one read: gateway "
                        "replicas must share one --cursor-secret-file"
                    ) from gone
                restarted = True
                shown.restart()
                continue
            for r in page["records"]:
                key = r["key"].encode() if r["key"] is not None else None
                shown.add(topic, partition, key, r["value"].encode(), r["timestamp_ms"])
            shown.cursor = page["next"]
            if page["at_end"]:
                shown.scanned_at = time.monotonic()
                return shown

    async def consumer(self, group_id: str, topics: Sequence[str]) -> LogConsumer:
        raise GatewayRefused(
            "the gateway serves no consumer groups (by design: a hook follows its own run)"
        )

    # -- transport ---------------------------------------------------------------------
    async def _get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._call("GET", path, params=params)

    async def _call(
        self, method: str, path: str, *, final_ok: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        """The answer's JSON. ``final_ok``: a final refusal (:data:`FINAL_REFUSALS`) is
        said once and answered None instead of raised."""
        if self._client is None:
            raise ConnectionError("the gateway client is not started")
        response = await self._client.request(method, path, **kwargs)
        status = response.status_code
        if status == 410:
            raise _CursorGone(response.text[:200])
        if status >= 500 or status == 429:
            raise ConnectionError(f"gateway {status}: {response.text[:200]}")
        if final_ok and status in FINAL_REFUSALS:
            self._say(f"http-{status}", f"runwatch: the gateway refused {path}: {status} "
                      f"{response.text[:200]} (not retried)")  # fmt: skip
            return None  # type: ignore[return-value]
        if status >= 400:
            raise GatewayRefused(f"gateway refused {path}: {status} {response.text[:200]}")
        return response.json()

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message)


def _chunks(
    records: Sequence[tuple[bytes | None, bytes]],
) -> list[Sequence[tuple[bytes | None, bytes]]]:
    """``records`` in request-sized runs, in order (each at least one record)."""
    out, start, size = [], 0, 0
    for i, (key, value) in enumerate(records):
        weight = len(value) + (len(key) if key else 0) + 64
        if i > start and (size + weight > CHUNK_BYTES or i - start >= CHUNK_RECORDS):
            out.append(records[start:i])
            start, size = i, 0
        size += weight
    if start < len(records):
        out.append(records[start:])
    return out
