"""The ingress half of the trajectory API: every write endpoint appends events.

``/register``, ``/register-env``, ``/disconnect-env``, ``/scored_data``,
``/scored_data_list`` and ``/reset_data`` turn a request into events on the run's
``runwatch.trajectories`` partition and answer only once the log acknowledged them
(Kafka: acks=all), so a 200 means durable. A scored group's bytes go to
``runwatch.trajectory-payloads`` first (one record per group, as ``/batch`` returns it);
only then its small ``ScoredDataGroupStored`` goes on the ordered partition. Bodies and
answers follow the reference server (see :mod:`producers.trajectory_api.models`); on top
of it:

- backpressure: when the run's queue holds ``max_queue_groups`` groups (plus what this
  instance appended and has not folded yet), pushes get 503 with ``Retry-After`` and
  nothing is appended (a list is all or nothing);
- a server still catching up with the log answers ``/register-env`` with "wait for
  trainer to start", which rollout handlers already retry on;
- validation beyond the reference's schema (422, nothing appended): registration sizes
  (:class:`~producers.trajectory_api.models.Registration`), and each group's shape, token
  ids and size against the registered ``batch_size``
  (:class:`~producers.trajectory_api.models.GroupRules`), so a group the batching
  processor would reject, or a trainer could not use, is answered as refused;
- exactly once for retried pushes: an ``Idempotency-Key`` header, and optional content
  dedupe (:mod:`producers.trajectory_api.once`).

The router knows the host only through :class:`IngressHost` (the composition root
provides it); it never imports the batching processor or the view.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from events.catalog.trajectory import (
    ScoredDataGroupStored,
    TrajectoryDataReset,
    TrajectoryEnvDisconnected,
    TrajectoryEnvRegistered,
    TrajectoryTrainerRegistered,
)
from events.envelope import EventBase
from events.log.base import Appended
from producers.trajectory_api import once
from producers.trajectory_api.models import (
    AcceptedGroup,
    EnvIdentifier,
    GroupRules,
    InvalidBody,
    RegisterEnv,
    Registration,
    accept_groups,
)


class IngressHost(Protocol):
    """What the ingress needs: durable appends, envelopes, and the folded state."""

    max_off_policy_steps: int | None
    max_queue_groups: int
    #: the model's vocabulary size, when the operator configured it (token ids are
    #: checked against it); None: only negative ids are refused
    vocab_size: int | None
    ready: bool
    started: bool
    step: int
    env_count: int
    #: the registered trainer's batch_size as folded so far (None: not registered)
    batch_size: int | None
    #: accepted groups after which a push's key and digests are forgotten (on its events)
    dedupe_window: int
    #: whether byte-identical groups are stored once (``--dedupe-content``)
    dedupe_content: bool

    def envelope(self) -> dict[str, Any]: ...

    def pushed(self, key: str) -> once.PushedKey | None:
        """What the fold kept of ``Idempotency-Key`` ``key`` (None: not within the window)."""
        ...

    def content_pushed(self, digest: str) -> bool:
        """Whether a group with this payload digest was accepted within the window."""
        ...

    async def wait_ready(self, timeout_s: float | None = None) -> None: ...

    def backlog_groups(self) -> int: ...

    def env_group_size(self, env_id: int | None) -> int | None: ...

    def expect(self, request_id: str) -> asyncio.Future[Any]: ...

    async def append(self, events: Sequence[EventBase], groups: int = 0) -> None: ...

    async def append_payloads(self, payloads: Sequence[tuple[str, bytes, int]]) -> list[Appended]:
        """Append (group id, payload bytes, crc32) to the payload topic; returns once
        durable."""
        ...


#: How long a request waits for the batching processor to fold its event.
ANSWER_TIMEOUT_S = 30.0


def replayed(answer: dict[str, Any]) -> Response:
    """A retry's answer: the first push's, marked as a replay (Stripe's header)."""
    return JSONResponse(answer, headers={"Idempotent-Replayed": "true"})


def unavailable(message: str, retry_after_s: int = 1) -> Response:
    return JSONResponse(
        {"detail": message}, status_code=503, headers={"Retry-After": str(retry_after_s)}
    )


def group_event(
    host: IngressHost,
    group_id: str,
    group: AcceptedGroup,
    at: Appended,
    key: str | None = None,
    index: int = 0,
    digest: str | None = None,
) -> ScoredDataGroupStored:
    return ScoredDataGroupStored(
        **{**host.envelope(), "step": host.step},
        group_id=group_id,
        env_id=group.env_id,
        num_sequences=group.num_sequences,
        mean_score=group.mean_score,
        payload_partition=at.partition,
        payload_offset=at.offset,
        payload_bytes=len(group.payload),
        payload_crc=group.crc,
        idempotency_key=key,
        key_index=index,
        content_digest=digest,
        dedupe_window=host.dedupe_window if key or digest else 0,
    )


def build_router(host: IngressHost, inflight: once.InFlight | None = None) -> APIRouter:
    """The write endpoints over ``host``; ``inflight``: the table of keyed pushes being
    made durable (one per app; a new one if not given)."""
    router = APIRouter()
    inflight = inflight if inflight is not None else once.InFlight()

    async def push(request: Request, many: bool) -> Response | dict[str, Any]:
        key = request.headers.get(once.HEADER)
        if key is not None and (error := once.key_error(key)) is not None:
            return JSONResponse({"detail": error}, status_code=422)
        # a group that breaks the rules is refused here rather than stored, answered
        # "received" and then rejected on the log (or served to a trainer it crashes)
        rules = GroupRules(vocab_size=host.vocab_size, max_sequences=host.batch_size)
        try:
            groups = accept_groups(await request.body(), many, rules)
        except InvalidBody as exc:
            return JSONResponse({"detail": exc.detail}, status_code=422)
        if key is None:
            return await store(groups, many, None)
        if not host.ready:  # the key may be on the part of the log not folded yet
            try:
                await host.wait_ready(ANSWER_TIMEOUT_S)
            except TimeoutError:
                return unavailable("catching up with the log; retry")
        first = await inflight.first(key)
        folded = host.pushed(key)
        crcs = first[1] if first is not None else folded.crcs if folded is not None else ()
        if once.conflicts(crcs, groups):
            return JSONResponse(
                {"detail": f"Idempotency-Key {key!r} was used for a push with another body"},
                status_code=422,
            )
        if first is not None:
            return replayed(first[0])
        if folded is not None and once.complete(folded.crcs, groups):
            n = len(groups)
            return replayed(once.answer(many, n, folded.buffered, folded.last_buffer))
        attempt = inflight.begin(key)
        result = None
        try:
            answered = await store(groups, many, key)
            if isinstance(answered, dict):
                result = (answered, tuple(g.crc for g in groups))
            return answered
        finally:
            inflight.end(key, attempt, result)

    async def store(
        groups: list[AcceptedGroup], many: bool, key: str | None
    ) -> Response | dict[str, Any]:
        """Append the groups (payloads first) and answer; with content dedupe, groups
        accepted before (or earlier in this body) are answered as duplicates instead."""
        digests: list[str | None] = [None] * len(groups)
        todo = list(range(len(groups)))
        if host.dedupe_content:
            seen: set[str] = set()
            todo = []
            for i, g in enumerate(groups):
                d = digests[i] = once.digest(g.payload)
                if d not in seen and not host.content_pushed(d):
                    todo.append(i)
                seen.add(d)
        duplicates = len(groups) - len(todo)
        if not todo:
            return once.answer(many, len(groups), duplicates=duplicates)
        queued = host.backlog_groups()
        if queued + len(todo) > host.max_queue_groups:
            return unavailable(
                f"trajectory queue full: {queued} groups queued, cap {host.max_queue_groups}; "
                "retry later"
            )
        ids = [secrets.token_hex(16) for _ in todo]
        # the payloads first (durable), then the small events that point at them: a group
        # is on the ordered partition only once its bytes are on the log
        fresh = [groups[i] for i in todo]
        where = await host.append_payloads([(gid, g.payload, g.crc) for gid, g in zip(ids, fresh)])
        events = [
            group_event(host, gid, groups[i], at, key, i, digests[i])
            for gid, i, at in zip(ids, todo, where)
        ]
        # a group whose size differs from its env's group_size is buffered by the batching
        # processor (the reference's rule); its answer carries the buffer size, so wait
        # for the fold on those only
        waits = [
            host.expect(ev.group_id)
            for ev in events
            if (size := host.env_group_size(ev.env_id)) is not None and size != ev.num_sequences
        ]
        await host.append(events, groups=len(events))
        try:  # the groups are durable already; the buffer size is only informative
            answers = await asyncio.wait_for(asyncio.gather(*waits), ANSWER_TIMEOUT_S)
        except TimeoutError:
            answers = []
        buffered = [b for b in answers if b is not None]
        last = buffered[-1].buffer_sequences if buffered else -1
        return once.answer(many, len(groups), len(buffered), last, duplicates)

    @router.post("/scored_data")
    async def scored_data(request: Request) -> Any:
        return await push(request, many=False)

    @router.post("/scored_data_list")
    async def scored_data_list(request: Request) -> Any:
        return await push(request, many=True)

    @router.post("/register")
    async def register(registration: Registration) -> Any:
        requester = uuid.uuid4().int
        event = TrajectoryTrainerRegistered(
            **host.envelope(),
            requester_uuid=str(requester),
            max_off_policy_steps=host.max_off_policy_steps,
            **registration.model_dump(),
        )
        await host.append([event])
        return {"uuid": requester}

    @router.post("/register-env")
    async def register_env(body: RegisterEnv) -> Any:
        if not host.ready or not host.started:  # (catching up: the same "come back later")
            return {"status": "wait for trainer to start"}
        request_id = uuid.uuid4().hex
        answer = host.expect(request_id)
        await host.append(
            [TrajectoryEnvRegistered(**host.envelope(), request_id=request_id, **body.model_dump())]
        )
        try:
            return await asyncio.wait_for(answer, ANSWER_TIMEOUT_S)
        except TimeoutError:  # registered all the same; its id is in /status-env order
            return unavailable("registration is on the log but not folded yet; retry")

    @router.post("/disconnect-env")
    async def disconnect_env(body: EnvIdentifier) -> Any:
        if not 0 <= body.env_id < host.env_count:
            return {"status": "failure", "error": "list index out of range"}
        await host.append([TrajectoryEnvDisconnected(**host.envelope(), env_id=body.env_id)])
        return {"status": "success"}

    @router.get("/reset_data")
    async def reset_data() -> Any:
        await host.append([TrajectoryDataReset(**host.envelope())])
        return PlainTextResponse("Reset successful", status_code=200)

    return router
