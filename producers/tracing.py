"""Instrument rollout code with per-request trace events in one line (seed 003).

The seed adds ~50 lines of ``time.time()`` bookkeeping and ``log_manager.log(...)`` calls to
verl's ``sglang_rollout.py``. Here one :class:`RolloutTracer` per rollout worker does it::

    tracer = RolloutTracer(emitter, worker=self._rank, synchronize=torch.cuda.synchronize)

    def generate_sequences(self, prompts):
        tracer.next_step()                              # verl's ``self.step += 1``
        with tracer.span("preprocessing_duration"):
            ...

    async def _async_rollout_a_request(self, req):
        with tracer.request(req.request_id):           # every span inside names the request
            for turn in range(1, max_turns + 1):
                with tracer.turn(turn):
                    async with tracer.span("engine_async_generate") as span:
                        out = await engine.async_generate(...)
                        span.set(completion_tokens=len(out.ids), finish_reason=out.reason)

    @tracer.traced("reward_calc")                      # sync or async functions
    async def calc_reward(self, req): ...

What each span publishes: one :class:`~events.catalog.rollout.RolloutTraceRecorded` with
the tracer's worker and step, the request and turn of the enclosing
:meth:`RolloutTracer.request` / :meth:`RolloutTracer.turn` (context variables: they follow
asyncio tasks, so concurrent requests on one event loop never mix), ``ts`` = the wall
clock at the end (as verl logs), ``started_at`` = the wall clock at the start and
``duration_s`` from the monotonic clock. A span left by ``asyncio.CancelledError`` is
``aborted`` (verl's over-sampling cancels the slowest requests); one left by any other
exception records ``extra.error`` = the exception type. The exception always propagates.

Batched on the way out: events go through the :class:`~producers.emitter.Emitter`, which
writes them to its sink in batches of ``batch_size`` (and on ``flush``/``close``); call
:meth:`RolloutTracer.flush` at the end of a step so the profile of that step is complete
in the log. ``synchronize`` (e.g. ``torch.cuda.synchronize``) runs before both clock
readings, as the seed prescribes for GPU work. Emitting is guarded by a lock, so worker
threads may share a tracer.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from events.catalog.rollout import RolloutTraceRecorded
from producers.emitter import Emitter

P = ParamSpec("P")
R = TypeVar("R")

_REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("rw_request", default=None)
_TURN: contextvars.ContextVar[int | None] = contextvars.ContextVar("rw_turn", default=None)
_TYPED = frozenset(
    {
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "aborted",
        "unparseable",
        "policy_version",
    }
)


def _scalar(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


class Span:
    """One timed event in flight; publish happens when the ``with`` block ends."""

    __slots__ = ("_fields", "_perf0", "_started_at", "_tracer", "event_name", "extra")

    def __init__(self, tracer: RolloutTracer, event_name: str, fields: dict[str, Any]) -> None:
        self._tracer = tracer
        self.event_name = event_name
        self._fields = fields
        self.extra: dict[str, Any] = {}
        self._perf0 = 0.0
        self._started_at = 0.0

    def set(self, **values: Any) -> Span:
        """Attach facts learnt inside the span: typed fields (``completion_tokens``,
        ``prompt_tokens``, ``finish_reason``, ``aborted``, ``unparseable``,
        ``policy_version``) or anything else (kept in ``extra``)."""
        for key, value in values.items():
            if key in _TYPED:
                self._fields[key] = value
            else:
                self.extra[key] = _scalar(value)
        return self

    def _start(self) -> Span:
        self._tracer._sync()
        self._started_at = self._tracer.clock()
        self._perf0 = self._tracer.perf()
        return self

    def _finish(self, exc: BaseException | None) -> None:
        tracer = self._tracer
        tracer._sync()
        duration = max(0.0, tracer.perf() - self._perf0)
        if isinstance(exc, asyncio.CancelledError):
            self._fields["aborted"] = True
        elif exc is not None:
            self.extra["error"] = type(exc).__name__
        tracer._emit(self.event_name, self._started_at, duration, self._fields, self.extra)

    def __enter__(self) -> Span:
        return self._start()

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._finish(exc)

    async def __aenter__(self) -> Span:
        return self._start()

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._finish(exc)


class RolloutTracer:
    """Times rollout events of one worker and publishes them through an emitter."""

    def __init__(
        self,
        emitter: Emitter,
        *,
        worker: str | int,
        step: int | None = None,
        synchronize: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.emitter = emitter
        self.worker = str(worker)
        self.step = step
        #: The weight version the worker generates with; stamped on every span when set
        #: (set it after each weight sync). The profile's rollout-quality summary needs it.
        self.policy_version: int | None = None
        self.synchronize = synchronize
        self.clock = clock
        self.perf = perf
        self._lock = threading.Lock()

    def next_step(self) -> int:
        """Advance to the next step (1 after ``None``) and return it."""
        self.step = 1 if self.step is None else self.step + 1
        return self.step

    @contextmanager
    def request(self, request_id: str | int) -> Iterator[None]:
        """Spans inside name ``request_id`` (and start with no turn)."""
        req = _REQUEST.set(str(request_id))
        turn = _TURN.set(None)
        try:
            yield
        finally:
            _TURN.reset(turn)
            _REQUEST.reset(req)

    @contextmanager
    def turn(self, turn: int) -> Iterator[None]:
        """Spans inside belong to ``turn`` of the current request."""
        token = _TURN.set(turn)
        try:
            yield
        finally:
            _TURN.reset(token)

    def span(
        self,
        event_name: str,
        *,
        request_id: str | int | None = None,
        turn: int | None = None,
        **values: Any,
    ) -> Span:
        """A context manager (``with`` or ``async with``) timing ``event_name``.
        ``request_id``/``turn`` override the enclosing context; ``values`` as in
        :meth:`Span.set`."""
        rid = _REQUEST.get() if request_id is None else str(request_id)
        fields: dict[str, Any] = {"request_id": rid, "turn": _TURN.get() if turn is None else turn}
        if self.policy_version is not None:
            fields["policy_version"] = self.policy_version
        return Span(self, event_name, fields).set(**values)

    def traced(
        self,
        event_name: str | None = None,
        *,
        request_id_from: Callable[..., str | int | None] | None = None,
        **values: Any,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorate a sync or ``async`` function: every call is one span named
        ``event_name`` (default: the function's name). ``request_id_from(*args,
        **kwargs)`` picks the request id from the call's arguments."""

        def decorate(fn: Callable[P, R]) -> Callable[P, R]:
            name = event_name or fn.__name__

            def open_span(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Span:
                rid = request_id_from(*args, **kwargs) if request_id_from else None
                return self.span(name, request_id=rid, **values)

            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                    async with open_span(args, kwargs):
                        return await fn(*args, **kwargs)  # type: ignore[misc]

                return async_wrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                with open_span(args, kwargs):
                    return fn(*args, **kwargs)

            return wrapper

        return decorate

    def record(
        self,
        event_name: str,
        duration_s: float,
        *,
        end: float | None = None,
        request_id: str | int | None = None,
        turn: int | None = None,
        **values: Any,
    ) -> RolloutTraceRecorded:
        """Publish an event timed elsewhere (the seed's explicit ``log(..., duration=)``),
        ending ``end`` (default now)."""
        span = self.span(event_name, request_id=request_id, turn=turn, **values)
        finished = self.clock() if end is None else end
        return self._emit(event_name, finished - duration_s, duration_s, span._fields, span.extra)

    def flush(self) -> None:
        """Write every buffered event (call at the end of each step)."""
        with self._lock:
            self.emitter.flush()

    def _sync(self) -> None:
        if self.synchronize is not None:
            self.synchronize()

    def _emit(
        self,
        event_name: str,
        started_at: float,
        duration: float,
        fields: dict[str, Any],
        extra: dict[str, Any],
    ) -> RolloutTraceRecorded:
        with self._lock:
            return self.emitter.emit(
                RolloutTraceRecorded,
                step=self.step,
                ts=started_at + duration,
                worker=self.worker,
                event_name=event_name,
                duration_s=duration,
                started_at=started_at,
                extra=extra,
                **fields,
            )
