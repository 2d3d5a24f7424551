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
  lifecycle topics (the tenant's own records only, at their real offsets). Between the
  tenant's records the gateway scans other tenants' too; this client remembers where each
  partition's last scan ended, so a reader going on from its last record (the command
  feed) does not have the gateway scan the same stretch again.

``start`` asks ``/v1/ingest/whoami``: a key the gateway does not know fails the start (the
publisher then spools and says why). Time semantics: none of its own (the events carry
theirs); every call waits at most ``timeout_s``.
"""

from __future__ import annotations

import logging
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


class GatewayRefused(Exception):
    """The gateway refused the request itself (a bad key, 4xx), or it is one the gateway
    does not serve by design (consumer groups, reads that stop short of the end)."""


class GatewayLog(LogBackend):
    """The log as the ingest gateway at ``url`` shows it to ``api_key``'s tenant."""

    def __init__(
        self, url: str, api_key: str, *, timeout_s: float = 10.0, only_key: str | None = None
    ) -> None:
        """``only_key``: read only that key's records (a run's own: the gateway skips the
        others unread)."""
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
        #: (topic, partition) -> (where the last scan started, where it ended)
        self._scanned: dict[tuple[str, int], tuple[int, int]] = {}
        self._said: set[str] = set()

    async def start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            base_url=self.url,
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
        return list((await self._get(f"/v1/ingest/{topic}/partitions"))["partitions"])

    async def end_offset(self, topic: str, partition: int) -> int:
        return int((await self._get(f"/v1/ingest/{topic}/partitions/{partition}/end"))["end"])

    async def read(  # type: ignore[override]
        self, topic: str, partition: int = 0, from_offset: int = 0, until_end: bool = True
    ) -> AsyncIterator[Record]:
        if not until_end:
            raise GatewayRefused("the gateway serves reads up to the end only (by design)")
        where = (topic, partition)
        position = from_offset
        began, ended = self._scanned.get(where, (0, 0))
        if began <= position < ended:  # this reader saw everything up to there already
            position = ended
        while True:
            params: dict[str, Any] = {"start": position}
            if self.only_key is not None:
                params["key"] = self.only_key
            page = await self._get(
                f"/v1/ingest/{topic}/partitions/{partition}/records", params=params
            )
            for r in page["records"]:
                key = r["key"].encode() if r["key"] is not None else None
                yield Record(
                    topic, partition, r["offset"], key, r["value"].encode(), r["timestamp_ms"]
                )
            self._scanned[where] = (from_offset, page["next"])
            if page["next"] >= page["end"] or page["next"] <= position:
                return
            position = page["next"]

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
