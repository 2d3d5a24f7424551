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
  processor would reject, or a trainer could not use, is answered as refused.

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

    def envelope(self) -> dict[str, Any]: ...

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


def unavailable(message: str, retry_after_s: int = 1) -> Response:
    return JSONResponse(
        {"detail": message}, status_code=503, headers={"Retry-After": str(retry_after_s)}
    )


def group_event(
    host: IngressHost, group_id: str, group: AcceptedGroup, at: Appended
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
    )


def build_router(host: IngressHost) -> APIRouter:
    router = APIRouter()

    async def push(request: Request, many: bool) -> Response | None:
        # a group that breaks the rules is refused here rather than stored, answered
        # "received" and then rejected on the log (or served to a trainer it crashes)
        rules = GroupRules(vocab_size=host.vocab_size, max_sequences=host.batch_size)
        try:
            groups = accept_groups(await request.body(), many, rules)
        except InvalidBody as exc:
            return JSONResponse({"detail": exc.detail}, status_code=422)
        queued = host.backlog_groups()
        if queued + len(groups) > host.max_queue_groups:
            return unavailable(
                f"trajectory queue full: {queued} groups queued, cap {host.max_queue_groups}; "
                "retry later"
            )
        ids = [secrets.token_hex(16) for _ in groups]
        # the payloads first (durable), then the small events that point at them: a group
        # is on the ordered partition only once its bytes are on the log
        where = await host.append_payloads([(i, g.payload, g.crc) for i, g in zip(ids, groups)])
        events = [group_event(host, gid, g, at) for gid, g, at in zip(ids, groups, where)]
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
        request.state.groups = len(groups)
        request.state.buffered = buffered
        return None

    @router.post("/scored_data")
    async def scored_data(request: Request) -> Any:
        refused = await push(request, many=False)
        if refused is not None:
            return refused
        if request.state.buffered:
            return {
                "status": "buffered",
                "buffer_size": request.state.buffered[-1].buffer_sequences,
            }
        return {"status": "received"}

    @router.post("/scored_data_list")
    async def scored_data_list(request: Request) -> Any:
        refused = await push(request, many=True)
        if refused is not None:
            return refused
        answer: dict[str, Any] = {"status": "received", "groups_processed": request.state.groups}
        if request.state.buffered:
            answer["buffered"] = len(request.state.buffered)
            answer["last_buffer_size"] = request.state.buffered[-1].buffer_sequences
        return answer

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
