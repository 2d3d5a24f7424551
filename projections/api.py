"""The query API (FastAPI): the customer view and the operator view of the projections.

Served from a :class:`~projections.store.ReadModel` (never from the log directly).
Authentication: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (see
:mod:`projections.keys`). Tenant isolation: a tenant key only ever sees its own runs;
a run of another tenant and a run that does not exist answer the same ``404``, so ids
cannot be probed. Operator routes (``/v1/operator/...``) need an operator key (``403``).

Customer view (seed 000 step 5): state + plain-language reason + failure attribution, the
minimal charts (reward, KL, eval-gate scores, spend so far) and usage. Gradient norms, clip
fractions, alerts, the reward ledger and run mechanics are operator-only.

Commands (when the API was given a command sink): customers ``POST
/v1/runs/{id}/resume|cancel`` for their own runs, operators ``POST
/v1/operator/runs/{id}/pause|resume|cancel``. A command is judged against the projected
state (resume needs PAUSED_BY_GATE; nothing applies to an ended run: ``409``; a resume
with ``overrides`` needs a run trained by runwatch's trainer: a hooked run is the
customer's own job, which no command can reconfigure: ``409``, nothing written), written to
the run's control topic (``202``: accepted; the state changes when the trainer answers),
or recorded as ``CommandRejected``. Events name who asked: the customer's tenant, or the
operator key's entry (its ``name`` and key id, :func:`projections.auth.operator_label`).
Each principal (a tenant, an operator key) may send ``command_burst`` commands at once,
then ``command_rate`` per second, accepted or not (``429`` with ``Retry-After`` beyond).

Reads: each tenant may spend ``read_burst`` read tokens at once, then ``read_rate`` per
second (``429`` with ``Retry-After`` beyond; operator keys are not limited). A token is
priced at about a millisecond of the API's event loop: a read costs 1, plus one per
:data:`RUNS_COST` runs it loads (``GET /v1/runs``: the page; ``GET /v1/usage``: every run
of the tenant, counted and charged before they are loaded, then loaded off the event
loop), so a tenant with many runs pays for them and cannot stall the other tenants.

Request bodies: none is read without a valid key (``401`` first), none beyond
``max_body_bytes`` (``413``): :class:`projections.auth.KeyedBodies`.

``GET /healthz``: ``200 {"status": "ok"}``, or ``503 {"status": "unavailable", "reason":
...}`` when ``health`` (the server's follower check) names a problem.
"""

# No ``from __future__ import annotations`` here: FastAPI resolves the dependency
# annotations (closures over the store and keys) at definition time.
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Response
from fastapi import Path as Path_
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from producers.commands import bad_overrides, phase_of_state, write_command
from producers.sinks import EventSink
from projections.auth import MAX_BODY_BYTES, KeyedBodies, operator_label, principal_of
from projections.keys import ApiKeys, Principal
from projections.store import ReadModel
from projections.views import CUSTOMER_METRICS, OPERATOR_METRICS, RunView

MAX_PAGE = 500
MAX_POINTS = 10_000
#: The bound of every integer parameter that has no smaller natural one (offsets, steps):
#: the largest integer every JSON client reads exactly, well inside SQLite's 64-bit
#: integers, so a huge value is a 422 naming the bound, never an overflow (500).
MAX_INT = 2**53 - 1
NOT_FOUND = "run not found"
#: Commands a principal may send per second, sustained, and at once (the default).
COMMAND_RATE = 10.0
COMMAND_BURST = 20
#: Read tokens a tenant may spend per second, sustained, and at once (the default). A
#: token is priced at about 1 ms of the event loop (a small read), so a tenant reading at
#: its sustained rate takes ~10% of the loop.
READ_RATE = 100.0
READ_BURST = 1_000
#: Runs loaded (a run doc read and parsed, summed into usage) per read token. Measured
#: 2026-11-28 on the 2-core CI box (``/tmp/read-dos/calibrate_usage.py``: 40,000 runs
#: loaded and totalled in 1.37 s, 34 us a run): 1 ms buys ~30 runs. A ``/v1/usage`` of
#: 40,000 runs costs 1,334 tokens: more than the burst, so the tenant waits the rest off.
RUNS_COST = 30
Offset = Annotated[int, Query(ge=0, le=MAX_INT, description=f"0..{MAX_INT}")]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"1..{MAX_PAGE}")]
SinceStep = Annotated[int, Query(ge=0, le=MAX_INT, description=f"0..{MAX_INT}")]
PointLimit = Annotated[int, Query(ge=1, le=MAX_POINTS, description=f"1..{MAX_POINTS}")]


class Point(BaseModel):
    step: int
    value: float | None


class RunSummary(BaseModel):
    run_id: str
    state: str | None
    reason: str
    failure_class: str | None
    created_ts: float | None
    updated_ts: float
    last_step: int | None
    spend_usd: float


class RunPage(BaseModel):
    items: list[RunSummary]
    total: int
    offset: int
    limit: int
    next_offset: int | None


class Usage(BaseModel):
    gpu_seconds_by_pool: dict[str, float] = {}
    #: every device-second billed, by device kind ("cpu", "gpu")
    device_seconds_by_kind: dict[str, float] = {}
    tokens_generated: int = 0
    tokens_trained: int = 0
    committed_steps: int = 0
    spend_usd: float = 0.0
    cost_per_step_usd: float | None = None


class Failure(BaseModel):
    failure_class: str
    message: str
    examples: list[str]
    ledger: dict[str, int]
    health_history: list[dict[str, Any]]


class CustomerRun(RunSummary):
    algorithm: str
    failure: Failure | None
    usage: Usage
    transitions: list[dict[str, Any]]


class Charts(BaseModel):
    run_id: str
    reward: list[Point]
    kl: list[Point]
    eval_gate: list[Point]
    spend_usd: list[Point]
    next_since_step: int | None


class TenantUsage(BaseModel):
    tenant_id: str
    runs: int
    runs_by_state: dict[str, int]
    gpu_seconds_by_pool: dict[str, float]
    device_seconds_by_kind: dict[str, float] = {}
    tokens_generated: int
    tokens_trained: int
    committed_steps: int
    spend_usd: float
    cost_per_step_usd: float | None


class OperatorRun(BaseModel):
    tenant_id: str
    run: dict[str, Any]
    series: dict[str, list[Point]]


def _summary(v: RunView) -> dict[str, Any]:
    return {
        "run_id": v.run_id,
        "state": v.state,
        "reason": v.reason,
        "failure_class": v.failure_class,
        "created_ts": v.created_ts,
        "updated_ts": v.updated_ts,
        "last_step": v.last_step,
        "spend_usd": v.spend(),
    }


def _failure(v: RunView) -> Failure | None:
    a = v.attribution
    if not a or v.state != "FAILED":
        return None
    history = [
        {"detector": d, "reason": r, "window_start": s, "window_end": e}
        for d, r, s, e in a.get("health_history", ())
    ]
    return Failure(
        failure_class=a["failure_class"],
        message=a["message"],
        examples=list(a.get("examples", ())),
        ledger=dict(a.get("ledger", ())),
        health_history=history,
    )


def _json(model: BaseModel) -> Response:
    """The model serialized once, by pydantic-core. The hot customer routes return this
    instead of the model, so FastAPI does not dump and re-validate it (``response_model``
    still documents the schema); NaN metric values become ``null``."""
    return Response(model.model_dump_json(), media_type="application/json")


class CommandBody(BaseModel):
    reason: str = Field("", max_length=500)
    #: resume only: settings to change before continuing (e.g. ``{"lr": 0.001}``)
    overrides: dict[str, float] = Field(default_factory=dict, max_length=8)


class CommandAccepted(BaseModel):
    run_id: str
    action: str
    command_id: str
    status: str = "accepted"


#: The producer of runwatch's own trainer for a run (``trainer.publish.producer_name``):
#: the only training loop that applies a resume's settings. Any other loop (a hook's,
#: ``hook/<run>/...`` or a name a customer gave it) is the customer's own job: its hook can
#: resume it but cannot change its settings.
def trainer_producer(run_id: str) -> str:
    return f"trainer/{run_id}"


def settings_refusal(view: RunView, overrides: dict[str, object]) -> str:
    """Why a resume of ``view``'s run cannot carry ``overrides`` ('' when it can): only a
    run trained by runwatch's trainer applies them; anywhere else they would be dropped
    while the resume is accepted (the customer believing the fix is in). A run whose
    submitter is not known (a read model built before 2026-11-28 kept none) is let
    through, as before: refusing would turn away every such trainer run's resume."""
    producer = str(view.mechanics.get("producer") or "")
    if not producer or producer == trainer_producer(view.run_id):
        return ""
    names = ", ".join(sorted(overrides))
    return (
        f"cannot change {names} on resume: run {view.run_id} trains in your own job "
        "(a runwatch hook reports it), and runwatch cannot change its settings; change "
        f"{names} in your job's own configuration (e.g. restart it from its checkpoint), "
        "or resume without overrides"
    )


def _answers(view: RunView) -> str:
    """The pause a resume through this view names (``UnpauseRequested.answers``): the
    pause the view shows, where the process holding it refuses a resume naming another
    (a run paused again since the view was read refuses the resume rather than lift a
    pause the requester never saw); '' otherwise (a v1 resume, what older trainers and
    hooks read)."""
    m = view.mechanics
    return str(m.get("pause_id") or "") if m.get("pause_checked") else ""


def _points(pts: list[tuple[int, float]]) -> list[Point]:
    return [Point(step=s, value=v) for s, v in pts]


def take_or_429(bucket: "CommandRate", who: str, n: float, why: str) -> None:
    """Take ``n`` tokens from ``who``'s bucket, or answer ``429`` saying ``why``, with a
    ``Retry-After`` of the seconds until they are there (at least 1)."""
    wait = bucket.wait(who, n)
    if wait > 0:
        raise HTTPException(429, why, {"Retry-After": str(max(1, math.ceil(wait)))})


class CommandRate:
    """A token bucket per principal: ``burst`` commands at once, then ``rate`` per second.
    One event loop calls it (no lock: nothing awaits between the check and the take); a
    bucket per principal ever seen, so its size is bounded by the keys file."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("the command rate must be positive and the burst at least 1")
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def wait(self, who: str, n: float = 1.0) -> float:
        """0 if ``who`` may send ``n`` commands (or records) now (its tokens are taken),
        else the seconds until it may. ``n`` beyond the burst counts as the burst."""
        need = min(float(n), float(self.burst))
        now = self.clock()
        tokens, then = self._buckets.get(who, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens >= need:
            self._buckets[who] = (tokens - need, now)
            return 0.0
        self._buckets[who] = (tokens, now)
        return (need - tokens) / self.rate

    def debit(self, who: str, n: float) -> None:
        """Take ``n`` more tokens from ``who`` after the fact (a cost known only once the
        work is done), into debt if need be: its next :meth:`wait` waits it off."""
        if n <= 0:
            return
        now = self.clock()
        tokens, then = self._buckets.get(who, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        self._buckets[who] = (tokens - n, now)

    def refund(self, who: str, n: float) -> None:
        """Give ``who`` back ``n`` tokens taken by :meth:`wait` and not used (a cost
        reserved at its worst before the work, settled once it is known), up to the
        burst."""
        if n <= 0 or who not in self._buckets:
            return
        now = self.clock()
        tokens, then = self._buckets[who]
        tokens = min(float(self.burst), tokens + (now - then) * self.rate + n)
        self._buckets[who] = (tokens, now)

    def settle(self, who: str, reserved: float, cost: float) -> None:
        """``who`` took ``reserved`` tokens (:meth:`wait`) for work that cost ``cost``:
        refund the difference, or debit it (into debt if need be)."""
        if cost > reserved:
            self.debit(who, cost - reserved)
        else:
            self.refund(who, reserved - cost)


def create_app(
    store: ReadModel,
    keys: ApiKeys,
    title: str = "runwatch query API",
    commands: EventSink | None = None,
    *,
    health: Callable[[], str | None] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    command_rate: float | None = COMMAND_RATE,
    command_burst: int = COMMAND_BURST,
    read_rate: float | None = READ_RATE,
    read_burst: int = READ_BURST,
) -> FastAPI:
    """The app over ``store``; ``commands``: where pause/resume/cancel commands are
    written (the log's control topic), or None (the command routes answer 503).
    ``health``: what is wrong with the server (``None``: nothing), asked by ``/healthz``.
    ``command_rate`` (per second; ``None``: no limit) and ``command_burst``: the command
    routes' limit per principal. ``read_rate`` (read tokens per second; ``None``: no
    limit) and ``read_burst``: each tenant's read limit (module docstring)."""
    app = FastAPI(
        title=title,
        version="1.0.0",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else "",
    )
    app.add_middleware(KeyedBodies, keys=keys, max_bytes=max_body_bytes)

    principal = principal_of(keys)
    rate = CommandRate(command_rate, command_burst) if command_rate is not None else None
    reads = CommandRate(read_rate, read_burst) if read_rate is not None else None

    def charge(who: Principal, cost: float) -> float:
        """Take ``cost`` read tokens from ``who``'s tenant (beyond the request's own token:
        at most the burst less 1; what was taken is returned, for
        :meth:`CommandRate.settle`), or ``429`` with ``Retry-After``. Operators are not
        limited (0 taken)."""
        if reads is None or who.operator:
            return 0.0
        if cost > 1.0:  # the request's own token is taken first: the rest fits the burst
            cost = min(cost, reads.burst - 1.0)
        why = (
            f"over this tenant's read rate ({reads.rate:g} tokens a second, a token a "
            f"request plus one per {RUNS_COST} runs loaded): retry later"
        )
        take_or_429(reads, f"tenant:{who.tenant_id}", cost, why)
        return min(float(cost), float(reads.burst))

    def settle(who: Principal, taken: float, cost: float) -> None:
        """``who`` took ``taken`` tokens for a read that cost ``cost``: the difference
        refunded or owed (its next read waits it off)."""
        if reads is not None and not who.operator:
            reads.settle(f"tenant:{who.tenant_id}", taken, cost)

    async def reader(who: Annotated[Principal, Depends(principal)]) -> Principal:
        """The principal of a read, its one token taken (``429`` over its read rate)."""
        charge(who, 1.0)
        return who

    async def operator(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.operator:
            raise HTTPException(403, "operator key required")
        return who

    def visible_run(run_id: str, who: Principal) -> RunView:
        # The tenant is part of the lookup (one index seek on (run_id, tenant_id)): a run of
        # another tenant is never read, so it answers the same 404 as an unknown id at the
        # same cost -- no body and no timing tell them apart.
        view = store.get_run(run_id, None if who.operator else who.tenant_id)
        if view is None or not who.can_read(view.tenant_id):
            raise HTTPException(404, NOT_FOUND)
        return view

    def page(views: list[RunView], total: int, offset: int, limit: int) -> RunPage:
        nxt = offset + len(views) if offset + len(views) < total else None
        items = [RunSummary(**_summary(v)) for v in views]
        return RunPage(items=items, total=total, offset=offset, limit=limit, next_offset=nxt)

    @app.get("/healthz", tags=["meta"], responses={503: {"description": "unhealthy"}})
    async def healthz() -> Response:
        """``ok``, or 503 with the reason (the follower stopped or stalled: the views are
        no longer kept up to date)."""
        reason = health() if health is not None else None
        if reason:
            return JSONResponse({"status": "unavailable", "reason": reason}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/runs", response_model=RunPage, tags=["customer"])
    async def list_runs(
        who: Annotated[Principal, Depends(reader)],
        offset: Offset = 0,
        limit: Limit = 50,
        state: str | None = None,
    ) -> Response:
        """Your runs, oldest first (operators: every run). Costs a read token plus one per
        :data:`RUNS_COST` runs on the page (``limit`` of them taken first, the rest given
        back)."""
        tenant = None if who.operator else who.tenant_id
        taken = charge(who, limit / RUNS_COST)
        views, total = store.list_runs(tenant, offset, limit, state)
        settle(who, taken, len(views) / RUNS_COST)
        return _json(page(views, total, offset, limit))

    @app.get("/v1/runs/{run_id}", response_model=CustomerRun, tags=["customer"])
    async def get_run(run_id: str, who: Annotated[Principal, Depends(reader)]) -> Response:
        """State, reason, failure attribution and usage of one of your runs."""
        v = visible_run(run_id, who)
        usage = {k: v.usage[k] for k in Usage.model_fields if k in v.usage}
        transitions = [
            {k: t[k] for k in ("ts", "step", "from_state", "to_state", "reason", "failure_class")}
            for t in v.transitions
        ]
        return _json(
            CustomerRun(
                **_summary(v),
                algorithm=v.algorithm,
                failure=_failure(v),
                usage=Usage(**usage),
                transitions=transitions,
            )
        )

    @app.get("/v1/runs/{run_id}/charts", response_model=Charts, tags=["customer"])
    async def charts(
        run_id: str,
        who: Annotated[Principal, Depends(reader)],
        since_step: SinceStep = 0,
        limit: PointLimit = 1000,
    ) -> Response:
        """The customer chart set: reward, KL, eval-gate scores, spend so far (by step)."""
        visible_run(run_id, who)
        s = store.series(run_id, CUSTOMER_METRICS, since_step, limit)
        last = [pts[-1][0] for pts in s.values() if len(pts) == limit]
        return _json(
            Charts(
                run_id=run_id,
                reward=_points(s["reward_mean"]),
                kl=_points(s["kl_to_ref"]),
                eval_gate=_points(s["eval_score"]),
                spend_usd=_points(s["spend_usd"]),
                next_since_step=min(last) + 1 if last else None,
            )
        )

    @app.get("/v1/usage", response_model=TenantUsage, tags=["customer"])
    async def usage(who: Annotated[Principal, Depends(reader)]) -> TenantUsage:
        """Your tenant's aggregate usage and spend. Costs a read token plus one per
        :data:`RUNS_COST` runs of the tenant: counted (an index count) and charged before
        they are loaded (beyond the burst: owed, waited off by the next read), then loaded
        and summed on a worker thread (one consistent query), not on the event loop."""
        if who.operator:
            raise HTTPException(400, "operators: use /v1/operator/tenants")
        from projections.store import tenant_totals

        _, runs = store.list_runs(who.tenant_id, 0, 0)
        settle(who, charge(who, runs / RUNS_COST), runs / RUNS_COST)  # the rest owed

        def load() -> list[dict[str, Any]]:
            return tenant_totals(store.list_runs(who.tenant_id, 0, 10**9)[0])

        totals = await run_in_threadpool(load)
        if totals:
            return TenantUsage(**totals[0])
        return TenantUsage(
            tenant_id=who.tenant_id or "",
            runs=0,
            runs_by_state={},
            gpu_seconds_by_pool={},
            tokens_generated=0,
            tokens_trained=0,
            committed_steps=0,
            spend_usd=0.0,
            cost_per_step_usd=None,
        )

    @app.get("/v1/operator/runs", response_model=RunPage, tags=["operator"])
    async def op_list_runs(
        _: Annotated[Principal, Depends(operator)],
        tenant_id: str | None = None,
        state: str | None = None,
        offset: Offset = 0,
        limit: Limit = 50,
    ) -> RunPage:
        views, total = store.list_runs(tenant_id, offset, limit, state)
        return page(views, total, offset, limit)

    @app.get("/v1/operator/runs/{run_id}", response_model=OperatorRun, tags=["operator"])
    async def op_get_run(
        run_id: str,
        who: Annotated[Principal, Depends(operator)],
        since_step: SinceStep = 0,
        limit: PointLimit = 1000,
    ) -> OperatorRun:
        """All layers: state machine (incl. rejected transitions), alerts, reward ledger,
        usage, run mechanics, and every per-step series."""
        v = visible_run(run_id, who)
        s = store.series(run_id, OPERATOR_METRICS, since_step, limit)
        return OperatorRun(
            tenant_id=v.tenant_id, run=v.to_doc(), series={k: _points(p) for k, p in s.items()}
        )

    def throttle(who: Principal) -> None:
        """429 once ``who`` (a tenant; an operator key) is over its command rate."""
        if rate is None:
            return
        key = (
            f"operator:{getattr(who, 'key_sha256', '')}"
            if who.operator
            else f"tenant:{who.tenant_id}"
        )
        why = (
            f"too many commands: at most {rate.burst} at once, then {rate.rate:g} per "
            "second; retry later"
        )
        take_or_429(rate, key, 1.0, why)

    async def command(
        run_id: str, action: str, who: Principal, body: CommandBody | None
    ) -> CommandAccepted:
        if commands is None:
            raise HTTPException(503, "commands are not enabled on this API (serve --commands)")
        throttle(who)
        view = visible_run(run_id, who)  # 404 for a foreign or unknown run
        body = body or CommandBody()
        overrides: dict[str, object] = {
            k: int(v) if k == "rollback_to_step" and float(v).is_integer() else v
            for k, v in body.overrides.items()
        }
        if overrides and action != "resume":
            raise HTTPException(422, "only a resume takes settings to change")
        if why := bad_overrides(overrides):
            raise HTTPException(422, why)
        phase = phase_of_state(view.state)
        # a resume the run could take, whose settings it could not (a run that is not
        # paused is refused below for that, as before: an ended run is "ended")
        if overrides and phase == "paused" and (why := settings_refusal(view, overrides)):
            raise HTTPException(409, why)
        issued = await run_in_threadpool(
            lambda: write_command(
                commands,
                run_id=run_id,
                tenant_id=view.tenant_id,
                action=action,
                phase=phase,
                actor="operator" if who.operator else "customer",
                principal=operator_label(keys, who) if who.operator else str(who.tenant_id),
                reason=body.reason,
                overrides=overrides,
                answers=_answers(view) if action == "resume" else "",
            )
        )
        if issued.refused:
            raise HTTPException(409, f"cannot {action} run {run_id}: {issued.refused}")
        return CommandAccepted(
            run_id=run_id, action=action, command_id=str(issued.command.event_id)
        )

    @app.post(
        "/v1/runs/{run_id}/resume", response_model=CommandAccepted, status_code=202,
        tags=["customer"],
    )  # fmt: skip
    async def resume_run(
        run_id: str,
        who: Annotated[Principal, Depends(principal)],
        body: Annotated[CommandBody | None, Body()] = None,
    ) -> CommandAccepted:
        """Resume your paused run (optionally with settings changed: ``overrides``)."""
        return await command(run_id, "resume", who, body)

    @app.post(
        "/v1/runs/{run_id}/cancel", response_model=CommandAccepted, status_code=202,
        tags=["customer"],
    )  # fmt: skip
    async def cancel_run(
        run_id: str,
        who: Annotated[Principal, Depends(principal)],
        body: Annotated[CommandBody | None, Body()] = None,
    ) -> CommandAccepted:
        """Cancel your run: the trainer stops at its next step boundary."""
        return await command(run_id, "cancel", who, body)

    @app.post(
        "/v1/operator/runs/{run_id}/{action}", response_model=CommandAccepted,
        status_code=202, tags=["operator"],
    )  # fmt: skip
    async def op_command(
        run_id: str,
        action: Annotated[str, Path_(pattern="^(pause|resume|cancel)$")],
        who: Annotated[Principal, Depends(operator)],
        body: Annotated[CommandBody | None, Body()] = None,
    ) -> CommandAccepted:
        """Pause, resume or cancel any run."""
        return await command(run_id, action, who, body)

    @app.get("/v1/operator/tenants", response_model=list[TenantUsage], tags=["operator"])
    async def op_tenants(_: Annotated[Principal, Depends(operator)]) -> list[TenantUsage]:
        return [TenantUsage(**t) for t in store.tenants()]

    @app.get("/v1/operator/fleet", tags=["operator"])
    async def op_fleet(_: Annotated[Principal, Depends(operator)]) -> dict[str, Any]:
        return {"fleet": store.fleet().to_doc(), "positions": store.positions()}

    # --- customer dashboard (issue 9; projections/dashboard/) -------------------------
    from projections.dashboard import create_router as dashboard_router

    app.include_router(dashboard_router(store, keys))
    # --- end customer dashboard ---------------------------------------------------------

    return app


# Endpoints are ``async def`` on purpose: each store read is a short indexed SQLite query
# (well under a millisecond), cheaper on the event loop than a thread-pool hop per request.
# The exception is ``/v1/usage``, which loads every run of the tenant: on a worker thread,
# and paid for by the run (:data:`RUNS_COST`).
