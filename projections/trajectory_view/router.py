"""The serving half of the trajectory API: reads answered from the view.

While the instance is still folding the log up to its start, ``/batch`` answers
``{"batch": null}`` (what Atropos trainers already wait on) with ``Retry-After``, and
``/health`` answers 503.

``/batch`` is the one read with a write: it appends ``TrajectoryBatchRequested``, waits
until the batching processor's answer for that request has been folded into the view,
commits ``TrajectoryBatchDelivered`` (acks=all; gzip runs meanwhile) and only then writes
the response. A
request whose answer cannot be written (timeout, failure) is released
(``TrajectoryBatchReleased``) so its groups go back to the queue. The batch body is
spliced from the group payloads (no re-encoding; those this instance did not ingest are
read from the payload topic) and gzipped here when the client
accepts gzip, so the commit happens after every expensive step.

The router knows the host only through :class:`ServingHost` (composition root).
"""

from __future__ import annotations

import asyncio
import gzip
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from events.catalog.trajectory import (
    TrajectoryBatchDelivered,
    TrajectoryBatchReleased,
    TrajectoryBatchRequested,
    TrajectoryBatchServed,
    TrajectoryBatchUnavailable,
)
from events.envelope import EventBase
from projections.trajectory_view.view import EMPTY_EXAMPLE, TrajectoryView


class ServingHost(Protocol):
    view: TrajectoryView
    ready: bool
    position: int
    ready_offset: int
    resumed_from: int | None
    batch_timeout_s: float
    gzip_level: int

    def envelope(self) -> dict[str, Any]: ...

    def expect(self, request_id: str) -> asyncio.Future[Any]: ...

    async def append(self, events: Sequence[EventBase], groups: int = 0) -> None: ...

    async def batch_body(self, group_ids: tuple[str, ...]) -> bytes:
        """The ``/batch`` body of these groups (payloads this instance lacks are read
        from the log)."""
        ...

    async def latest_example(self) -> bytes | None: ...


NOT_REGISTERED = {
    "status": "error",
    "message": "Trainer not registered. Call /register first.",
    "batch": [],
}
GZIP_MIN_BYTES = 1000


class EnvIdentifier(BaseModel):
    env_id: int


def _retry(message: str) -> Response:
    return JSONResponse({"detail": message}, status_code=503, headers={"Retry-After": "1"})


def build_router(host: ServingHost) -> APIRouter:
    router = APIRouter()
    view = host.view

    @router.get("/")
    async def root() -> Any:
        return {"message": "AtroposLib API"}

    @router.get("/batch")
    async def batch(request: Request) -> Any:
        if not host.ready:  # catching up with the log: "no batch yet", as clients expect
            return JSONResponse({"batch": None}, headers={"Retry-After": "1"})
        if view.registration is None:
            return NOT_REGISTERED
        request_id = uuid.uuid4().hex
        answer = host.expect(request_id)
        await host.append([TrajectoryBatchRequested(**host.envelope(), request_id=request_id)])
        try:
            result = await asyncio.wait_for(answer, host.batch_timeout_s)
        except TimeoutError:
            await host.append([TrajectoryBatchReleased(**host.envelope(), request_id=request_id)])
            return _retry("batching processor did not answer in time")
        if isinstance(result, TrajectoryBatchUnavailable):
            if result.reason == "not_registered":
                return NOT_REGISTERED
            return {"batch": None}
        assert isinstance(result, TrajectoryBatchServed)
        try:
            if await request.is_disconnected():  # nobody to deliver to: give the groups back
                raise ConnectionAbortedError("client went away before its batch was ready")
            body = await host.batch_body(result.group_ids)
            headers = {"Vary": "Accept-Encoding"}
            commit = host.append(
                [TrajectoryBatchDelivered(**host.envelope(), request_id=request_id)]
            )
            gzip_ok = "gzip" in request.headers.get("accept-encoding", "")
            if gzip_ok and len(body) >= GZIP_MIN_BYTES:  # compress while the commit travels
                body, _ = await asyncio.gather(
                    asyncio.to_thread(gzip.compress, body, host.gzip_level, mtime=0), commit
                )
                headers["Content-Encoding"] = "gzip"
            else:
                await commit
        except BaseException:
            await asyncio.shield(
                host.append([TrajectoryBatchReleased(**host.envelope(), request_id=request_id)])
            )
            raise
        return Response(body, media_type="application/json", headers=headers)

    @router.get("/health")
    async def health() -> Any:
        """runwatch's own readiness probe (not in the Atropos contract): 200 once this
        instance has folded the log up to its start, 503 while it catches up, and 503
        with the reason in ``problem`` while the host reports one (its tail task died,
        or stalled with records waiting: ``health_problem()``, where the host has it)."""
        check = getattr(host, "health_problem", None)
        problem = check() if check is not None else None
        body = {
            "ready": host.ready,
            "problem": problem,
            "position": host.position,
            "start_offset": host.ready_offset,
            "resumed_from": host.resumed_from,
            "queued_groups": len(view.queue),
        }
        return JSONResponse(body, status_code=200 if host.ready and not problem else 503)

    @router.get("/latest_example")
    async def latest_example() -> Any:
        latest = await host.latest_example()
        if latest is None:
            return EMPTY_EXAMPLE
        return Response(latest, media_type="application/json")

    @router.get("/status")
    async def status() -> Any:
        return view.status()

    @router.get("/info")
    async def info() -> Any:
        return view.info()

    @router.get("/wandb_info")
    async def wandb_info() -> Any:
        return view.wandb_info()

    @router.get("/status-env")
    async def status_env(request: Request) -> Any:
        """Existing clients send ``{"env_id": n}`` as a JSON body on this GET; a query
        parameter ``?env_id=n`` is accepted too."""
        raw = await request.body()
        try:
            if raw:
                env = EnvIdentifier.model_validate_json(raw)
            else:
                env = EnvIdentifier.model_validate({"env_id": request.query_params.get("env_id")})
        except ValidationError as exc:
            detail = [
                {"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]}
                for e in exc.errors(include_url=False)
            ]
            return JSONResponse({"detail": detail}, status_code=422)
        try:
            return view.status_env(env.env_id)
        except KeyError:
            return JSONResponse({"detail": f"unknown env_id {env.env_id}"}, status_code=404)

    return router
