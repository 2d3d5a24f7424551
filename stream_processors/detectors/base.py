"""What every run-health detector shares: the detector shape, alert episodes, small stats.

A detector is a pure fold over *one run's* telemetry, handed events in the order the
composite :class:`~stream_processors.detectors.run_health.RunHealthFold` accepted them
(late and repeated steps are already filtered out there, see its docstring). It returns
its new frozen state and zero or more :class:`AlertFired` / :class:`AlertResolved`.

Alert episodes: a condition that becomes true fires once (``AlertFired``) and stays
quiet while it holds; it resolves once (``AlertResolved``) when the detector's own
resolve rule says so. ``alert_id`` is ``"<run>:<detector>:<first step>"`` and event ids
are uuid5 of (producer, run, alert_id, kind), so a replay re-emits byte-identical events
whatever input event happened to trigger them.

Non-finite values: detectors skip NaN/inf metric values in their window arithmetic (a
NaN would poison every later window); the ``nan_metric`` detector reports each of them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

from events.catalog.derived import AlertFired, AlertResolved, Layer, Routing
from events.envelope import EventBase, derived_id

#: ``producer`` of every run-health alert, and part of each derived id. Never change it.
PRODUCER = "run-health"

P = TypeVar("P")
S = TypeVar("S")
AlertEvent = AlertFired | AlertResolved
NO_ALERTS: tuple[AlertEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class Settings(Generic[P]):
    """One detector's resolved configuration for one (tenant, algorithm)."""

    detector: str
    layer: Layer
    routing: Routing
    first_response: str
    params: P
    config_version: str
    #: Routing of an escalated alert (grad-norm spikes while clipping is engaged).
    escalated_routing: Routing = "page"


@dataclass(frozen=True, slots=True)
class RunContext:
    """Facts about the run the composite knows and detectors may read."""

    run_id: str
    tenant_id: str
    algorithm: str
    #: RunSubmitted.config (checkpoint cadence and the like); empty if not seen.
    run_config: tuple[tuple[str, Any], ...] = ()


class Detector(Protocol[S, P]):
    """The shape of one detector module's ``DETECTOR`` object."""

    name: ClassVar[str]
    layer: ClassVar[Layer]
    default_routing: ClassVar[Routing]
    first_response: ClassVar[str]
    Params: ClassVar[type]
    #: Event ``type`` tags the detector wants; others are never handed to it.
    handles: ClassVar[frozenset[str]]

    def initial(self) -> S: ...

    def apply(
        self, state: S, event: EventBase, cfg: Settings[P], ctx: RunContext
    ) -> tuple[S, Sequence[AlertEvent]]: ...


def run_config_int(ctx: RunContext, keys: Sequence[str]) -> int:
    """The first positive integer the run's submitted config gives for one of ``keys``.

    A key is looked up at the top level of ``RunSubmitted.config`` (verl's ``save_freq``,
    TRL's ``save_steps``, ...) and, dotted (``checkpoint.every``), inside the JSON of its
    ``config_json`` entry (how runwatch's own trainer submits its whole config). 0 when none
    is given. Pure; callers keep the answer in their state rather than ask every step.
    """
    config = dict(ctx.run_config)
    nested: Any = None
    for key in keys:
        value: Any = config.get(key)
        if value is None and "config_json" in config:
            if nested is None:
                try:
                    nested = json.loads(str(config["config_json"]))
                except ValueError:
                    nested = {}
            value = nested
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1:
            return int(value)
    return 0


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def alert_id(run_id: str, detector: str, first_step: int) -> str:
    return f"{run_id}:{detector}:{first_step}"


def fire(
    source: EventBase,
    cfg: Settings[Any],
    *,
    first_step: int,
    window: tuple[int, int],
    observed: Mapping[str, Any],
    thresholds: Mapping[str, Any],
    reason: str,
    escalated: bool = False,
) -> AlertFired:
    """The AlertFired of an episode starting at ``first_step`` (ts/step from ``source``)."""
    aid = alert_id(source.run_id, cfg.detector, first_step)
    kind = "escalated" if escalated else "fired"
    return AlertFired(
        event_id=derived_id(PRODUCER, source.run_id, aid, kind),
        tenant_id=source.tenant_id,
        run_id=source.run_id,
        step=source.step,
        ts=source.ts,
        producer=PRODUCER,
        seq=0,
        alert_id=aid,
        detector=cfg.detector,
        layer=cfg.layer,
        routing=cfg.escalated_routing if escalated else cfg.routing,
        window_start=window[0],
        window_end=window[1],
        observed=_rounded(observed),
        thresholds=_rounded(thresholds),
        config_version=cfg.config_version,
        reason=reason,
        first_response=cfg.first_response,
        escalated=escalated,
    )


def resolve(source: EventBase, cfg: Settings[Any], aid: str, reason: str) -> AlertResolved:
    return AlertResolved(
        event_id=derived_id(PRODUCER, source.run_id, aid, "resolved"),
        tenant_id=source.tenant_id,
        run_id=source.run_id,
        step=source.step,
        ts=source.ts,
        producer=PRODUCER,
        seq=0,
        alert_id=aid,
        detector=cfg.detector,
        reason=reason,
        config_version=cfg.config_version,
    )


def _rounded(values: Mapping[str, Any]) -> dict[str, Any]:
    """Floats rounded to 6 significant digits: readable, and stable across platforms."""
    return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in values.items()}


# --- small, allocation-light statistics ---------------------------------------------
# Hot per-step state is kept in NamedTuples: immutable like a frozen dataclass and about
# three times cheaper to build, which the >=100k step events/s/core goal needs.


#: ``record(Cls, (fields...))`` builds a NamedTuple record without its Python-level
#: ``__new__`` frame: the per-step hot paths use it (same immutable record, ~2x cheaper).
record = tuple.__new__


class Sums(NamedTuple):
    """Running least-squares sums over (step, value) points of one window (immutable)."""

    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0
    last: float = math.nan

    def add(self, x: float, y: float) -> Sums:
        n, sx, sy, sxx, sxy, syy, _ = self
        return record(Sums, (n + 1, sx + x, sy + y, sxx + x * x, sxy + x * y, syy + y * y, y))

    @property
    def mean(self) -> float:
        return self.sy / self.n if self.n else math.nan

    @property
    def std(self) -> float:
        if self.n < 2:
            return 0.0
        var = (self.syy - self.sy * self.sy / self.n) / (self.n - 1)
        return math.sqrt(var) if var > 0 else 0.0

    @property
    def slope(self) -> float:
        """Least-squares slope per step (``np.polyfit(x, y, 1)[0]``); 0 when undefined."""
        if self.n < 2:
            return 0.0
        den = self.n * self.sxx - self.sx * self.sx
        return (self.n * self.sxy - self.sx * self.sy) / den if den > 0 else 0.0


EMPTY_SUMS = Sums()


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (numpy's default method)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def median_iqr(values: Sequence[float]) -> tuple[float, float]:
    s = sorted(values)
    return quantile(s, 0.5), quantile(s, 0.75) - quantile(s, 0.25)


#: State record classes by name, for :mod:`stream_processors.detectors.state_codec`.
STATE_TYPES: dict[str, type] = {}

T = TypeVar("T", bound=type)


def state_type(cls: T) -> T:
    """Register a detector state class so folded state can be dumped and loaded."""
    if STATE_TYPES.get(cls.__name__, cls) is not cls:
        raise TypeError(f"state type name {cls.__name__!r} used twice")
    STATE_TYPES[cls.__name__] = cls
    return cls


state_type(Sums)


def band_update(
    history: tuple[float, ...], recent: tuple[float, ...], value: float, window: int, refresh: int
) -> tuple[tuple[float, ...], tuple[float, ...], bool]:
    """Append ``value``; every ``refresh`` values fold them into the trailing ``window``.

    Returns (history, recent, refreshed). The robust band is recomputed only when
    ``refreshed``: per step this costs a tiny tuple append, not a sort.
    """
    recent = (*recent, value)
    if len(recent) < refresh:
        return history, recent, False
    return (history + recent)[-window:], (), True
