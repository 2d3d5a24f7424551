"""Prometheus exporter: a custom collector that reads the read model at scrape time.

Naming (prometheus.io/docs/practices/naming): ``runwatch_`` prefix, base units as suffix
(``_seconds``, ``_usd``), ``_total`` on counters. Cardinality (seed 000 step 6):

- no ``run_id`` label anywhere: every series here is fleet-level or per tenant;
- tenant labels are bounded: the first ``top_tenants`` tenants to appear keep their name,
  every other tenant is summed into ``tenant="other"`` (so ``sum()`` over tenants stays
  right), and a name once given is kept for the collector's life (:class:`TenantLabels`);
- other labels come from closed sets (states, failure classes, detectors, phases, pools).

Silent runs (found by review, F2: a hooked run whose log went away trained on for as long
as the outage lasted, shown RUNNING at its last shipped step, and nothing on the platform
said so): ``runwatch_runs_silent{tenant}`` counts the live runs (``RUNNING`` or
``DEGRADED``) whose newest fact is more than ``silent_after_s`` (:data:`SILENT_AFTER_S`,
600 s) old, and ``runwatch_runs_silent_max_age_seconds{tenant}`` is the age of the oldest
such newest fact among a tenant's live runs (0 with none live), so a rule can pick its
own bound. Time semantics: a run's newest fact is the largest event time (``ts``, the
producer's clock) folded into its view (``RunView.updated_ts``); its age is the scrape's
wall clock (``time.time()`` of the exporter's host) minus that, so a producer whose
clock runs ahead looks fresher than it is, one behind looks silent sooner. A paused run
(``PAUSED_BY_GATE``) is expected to be silent and is not counted, nor one not started
yet. A stalled projection makes every live run look silent: read it with
``runwatch_projection_last_event_timestamp_seconds``.

Nothing of the read model is cached between scrapes (only which tenants have names); each
read is guarded, so a read-model failure turns into
``runwatch_exporter_scrape_errors_total`` instead of a failed scrape.

Exposure: tenant names and spend are in these series, so :func:`start_metrics_server`
binds the loopback address unless told otherwise (``runwatch serve api --metrics-host``)
and, given a token, answers only ``Authorization: Bearer <token>`` (anything else: 401),
which is what Prometheus sends with ``authorization: {credentials_file: ...}``.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any, get_args
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from events.catalog.derived import RunState
from projections.fleet import PHASE_BUCKETS
from projections.run_state import TERMINAL
from projections.store import ReadModel
from projections.views import RunView

OTHER = "other"
#: Every run state, in the order of the append-only enum (derived from it: a state added
#: there is exported here without an edit).
STATES: tuple[str, ...] = get_args(RunState)
#: Run states that are expected to produce facts (a run in them and silent is news).
LIVE_STATES = frozenset({"RUNNING", "DEGRADED"})
#: Run states that wait for a person (a gate's pause holds the run's allocation meanwhile).
PAUSED_STATES = frozenset({"PAUSED_BY_GATE"})
#: A live run whose newest fact is older than this (seconds) is silent: twice a hook's
#: default ``pause_when_unmonitored_s`` (a hooked run out of touch that long is held),
#: well past a step's time for most runs.
SILENT_AFTER_S = 600.0


def bounded_tenants(views: list[RunView], top: int) -> dict[str, str]:
    """tenant -> label: the first ``top`` tenants to appear (by their earliest run's event
    time, ties by name) keep their id; later ones are summed under ``other``.

    Why first appearance and not top spend: the tenant families are counters, and a
    ranking that changes between scrapes would move a tenant's total into or out of
    ``other`` — a counter going down, which ``rate()`` reads as a reset. A new tenant
    only ever arrives after the labelled ones (with honest clocks; :class:`TenantLabels`
    keeps it so whatever the producers' clocks say), so every series here only grows."""
    first_seen: dict[str, float] = {}
    for v in views:
        ts = v.created_ts if v.created_ts is not None else v.updated_ts
        if v.tenant_id not in first_seen or ts < first_seen[v.tenant_id]:
            first_seen[v.tenant_id] = ts
    ranked = sorted(first_seen, key=lambda t: (first_seen[t], t))
    keep = set(ranked[:top])
    return {t: t if t in keep else OTHER for t in first_seen}


class TenantLabels:
    """The tenant labels of one collector: :func:`bounded_tenants` for the tenants that have
    no label yet, into the names still free; a name once given is never taken back.

    Why sticky: the ranking is by event time, which is the producer's clock. Recomputed at
    every scrape, a tenant whose first event claims an early ``ts`` would take a name from
    a tenant named before it, whose counters would move into ``other`` (a series going
    down, a reset to ``rate()``). Here a newcomer only ever gets a name that is free. A
    restarted exporter ranks afresh (its series start over anyway). Scrapes may run on
    several threads: one lock."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.named: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, views: list[RunView]) -> dict[str, str]:
        with self._lock:
            new = [v for v in views if v.tenant_id not in self.named]
            free = self.top - len(self.named)
            if new and free > 0:
                ranked = bounded_tenants(new, free)
                self.named.update(t for t, label in ranked.items() if label != OTHER)
            return {v.tenant_id: v.tenant_id if v.tenant_id in self.named else OTHER for v in views}


class _RunTotals:
    """What the run series of one scrape count, over every run view."""

    def __init__(self, views: list[RunView]) -> None:
        self.by_state = dict.fromkeys(STATES, 0)
        self.terminal: dict[tuple[str, str], int] = {}
        self.active: dict[tuple[str, str], int] = {}
        self.rejected = self.corrections = self.late = 0
        self.last_ts = 0.0
        for v in views:
            state = v.state or "SUBMITTED"
            self.by_state[state] = self.by_state.get(state, 0) + 1
            if state in TERMINAL:
                key = (state, v.failure_class or "none")
                self.terminal[key] = self.terminal.get(key, 0) + 1
            c = v.counters
            self.rejected += c.get("rejected_transitions", 0)
            self.corrections += c.get("corrections", 0)
            self.late += c.get("late_after_terminal", 0)
            self.last_ts = max(self.last_ts, v.updated_ts)
            if state not in TERMINAL:
                for a in v.alerts.values():
                    if a.get("resolved_ts") is None and "layer" in a:
                        k = (a["detector"], a["layer"])
                        self.active[k] = self.active.get(k, 0) + 1


class ProjectionCollector:
    def __init__(
        self,
        store: ReadModel,
        top_tenants: int = 10,
        *,
        silent_after_s: float = SILENT_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``silent_after_s``: how old a live run's newest fact may be before the run
        counts as silent; ``clock``: the scrape's wall clock (module docstring)."""
        self.store = store
        self.top_tenants = top_tenants
        self.silent_after_s = silent_after_s
        self.clock = clock
        self.labels = TenantLabels(top_tenants)
        self.errors = 0

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Metric]:
        try:
            views = self.store.all_views()
            fleet = self.store.fleet()
        except Exception:  # a scrape never raises: count it and expose what we can
            self.errors += 1
            views, fleet = None, None
        errors = CounterMetricFamily(
            "runwatch_exporter_scrape_errors", "Scrapes that could not read the read model."
        )
        errors.add_metric([], self.errors)
        yield errors
        if views is None or fleet is None:
            return
        yield from self._runs(views)
        yield from self._fleet(fleet)
        yield from self._tenants(views)

    def _runs(self, views: list[RunView]) -> Iterator[Metric]:
        t = _RunTotals(views)
        g = GaugeMetricFamily("runwatch_runs", "Runs by customer-facing state.", labels=["state"])
        for state, n in sorted(t.by_state.items()):
            g.add_metric([state], n)
        yield g
        c = CounterMetricFamily(
            "runwatch_runs_terminal",
            "Runs that reached a terminal state, by state and failure class.",
            labels=["state", "failure_class"],
        )
        for (state, fclass), n in sorted(t.terminal.items()):
            c.add_metric([state, fclass], n)
        yield c
        for name, doc, value in (
            (
                "runwatch_run_state_transitions_rejected",
                "Illegal run-state transitions rejected.",
                t.rejected,
            ),
            (
                "runwatch_run_state_corrections",
                "Run-state changes corrected after a late fact.",
                t.corrections,
            ),
            (
                "runwatch_run_state_late_after_terminal",
                "Facts that arrived after their run ended.",
                t.late,
            ),
        ):
            m = CounterMetricFamily(name, doc)
            m.add_metric([], value)
            yield m
        g = GaugeMetricFamily(
            "runwatch_alerts_active",
            "Unresolved alerts on live runs.",
            labels=["detector", "layer"],
        )
        for (det, layer), n in sorted(t.active.items()):
            g.add_metric([det, layer], n)
        yield g
        g = GaugeMetricFamily(
            "runwatch_projection_last_event_timestamp_seconds",
            "Event time (producer clock) of the newest fact folded into the projection.",
        )
        g.add_metric([], t.last_ts)
        yield g

    def _fleet(self, fleet: Any) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "runwatch_run_state_transitions",
            "Run-state changes by target state.",
            labels=["to_state"],
        )
        for state, n in sorted(fleet.transitions.items()):
            c.add_metric([state], n)
        yield c
        c = CounterMetricFamily(
            "runwatch_alerts_fired", "Alerts fired.", labels=["detector", "layer", "routing"]
        )
        for key, n in sorted(fleet.alerts_fired.items()):
            c.add_metric(key.split("|"), n)
        yield c
        c = CounterMetricFamily(
            "runwatch_reward_samples", "Reward samples by ledger cause.", labels=["cause"]
        )
        for cause, n in sorted(fleet.reward_samples.items()):
            c.add_metric([cause], n)
        yield c
        h = HistogramMetricFamily(
            "runwatch_step_phase_seconds",
            "Wall-clock seconds per training-step phase.",
            labels=["phase"],
        )
        for phase in sorted(fleet.phase_buckets):
            raw = fleet.phase_buckets[phase]
            cumulative, buckets = 0, []
            for upper, n in zip((*PHASE_BUCKETS, float("inf")), raw):
                cumulative += n
                buckets.append(("+Inf" if upper == float("inf") else repr(upper), cumulative))
            h.add_metric([phase], buckets, fleet.phase_sum_us.get(phase, 0) / 1e6)
        yield h
        c = CounterMetricFamily(
            "runwatch_projection_events", "Facts folded into the projection.", labels=["topic"]
        )
        for topic, n in sorted(fleet.events.items()):
            c.add_metric([topic], n)
        yield c
        c = CounterMetricFamily("runwatch_projection_dead_letters", "Records that did not decode.")
        c.add_metric([], fleet.dead_letters)
        yield c

    def _tenants(self, views: list[RunView]) -> Iterator[Metric]:
        label = self.labels(views)
        gpu: dict[tuple[str, str], float] = {}
        device: dict[tuple[str, str], float] = {}
        spend: dict[str, float] = {}
        tokens: dict[tuple[str, str], int] = {}
        steps: dict[str, int] = {}
        runs: dict[str, int] = {}
        for v in views:
            t = label.get(v.tenant_id, OTHER)
            u = v.usage
            runs[t] = runs.get(t, 0) + 1
            for pool, s in u.get("gpu_seconds_by_pool", {}).items():
                gpu[(t, pool)] = gpu.get((t, pool), 0.0) + s
            for kind, s in u.get("device_seconds_by_kind", {}).items():
                device[(t, kind)] = device.get((t, kind), 0.0) + s
            spend[t] = spend.get(t, 0.0) + u.get("spend_usd", 0.0)
            for kind in ("generated", "trained"):
                tokens[(t, kind)] = tokens.get((t, kind), 0) + u.get(f"tokens_{kind}", 0)
            steps[t] = steps.get(t, 0) + u.get("committed_steps", 0)
        families: list[tuple[str, str, list[str], dict[Any, Any], type]] = [
            (
                "runwatch_tenant_gpu_seconds",
                "GPU-seconds by tenant and pool.",
                ["tenant", "pool"],
                gpu,
                CounterMetricFamily,
            ),
            (
                "runwatch_tenant_device_seconds",
                "Device-seconds billed by tenant and device kind (cpu, gpu).",
                ["tenant", "kind"],
                device,
                CounterMetricFamily,
            ),
            (
                "runwatch_tenant_spend_usd",
                "Spend so far by tenant (list prices).",
                ["tenant"],
                spend,
                CounterMetricFamily,
            ),
            (
                "runwatch_tenant_tokens",
                "Tokens by tenant, generated or trained.",
                ["tenant", "kind"],
                tokens,
                CounterMetricFamily,
            ),
            (
                "runwatch_tenant_committed_steps",
                "Committed optimizer steps by tenant.",
                ["tenant"],
                steps,
                CounterMetricFamily,
            ),
            ("runwatch_tenant_runs", "Runs known per tenant.", ["tenant"], runs, GaugeMetricFamily),
        ]
        for name, doc, labels, values, cls in families:
            m = cls(name, doc, labels=labels)
            for key, value in sorted(values.items()):
                m.add_metric(list(key) if isinstance(key, tuple) else [key], value)
            yield m
        yield from self._silent(views, label)
        yield from self._paused(views, label)

    def _ages(
        self, views: list[RunView], label: dict[str, str], states: frozenset[str]
    ) -> tuple[dict[str, int], dict[str, float]]:
        """Per labelled tenant: how many of its runs in ``states`` are silent (newest fact
        older than ``silent_after_s``) and the oldest such age, at the scrape's wall clock
        (event times are the producers'). Every tenant is in both, at 0 when none."""
        now = self.clock()
        silent: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for v in views:
            t = label.get(v.tenant_id, OTHER)
            silent.setdefault(t, 0)
            oldest.setdefault(t, 0.0)
            if (v.state or "SUBMITTED") not in states:
                continue
            age = max(0.0, now - v.updated_ts)
            oldest[t] = max(oldest[t], age)
            if age > self.silent_after_s:
                silent[t] += 1
        return silent, oldest

    def _paused(self, views: list[RunView], label: dict[str, str]) -> Iterator[Metric]:
        """How long the oldest gate-paused run of each tenant has waited: a paused run
        holds its allocation (and a multi-process run's world) until someone resumes or
        cancels it, and nothing bounds a pause. Age: as :meth:`_silent`'s (a paused run
        sends nothing more after its ``RunPaused``)."""
        _, oldest = self._ages(views, label, PAUSED_STATES)
        yield _per_tenant(
            "runwatch_runs_paused_max_age_seconds",
            "Age at the scrape (exporter's wall clock) of the newest fact of a tenant's "
            "longest-paused PAUSED_BY_GATE run (event time, producer clock); 0 with none.",
            oldest,
        )

    def _silent(self, views: list[RunView], label: dict[str, str]) -> Iterator[Metric]:
        """Live runs whose newest fact is old, per tenant (module docstring); every
        labelled tenant has both series (0 when none), so a rule needs no ``absent()``."""
        silent, oldest = self._ages(views, label, LIVE_STATES)
        yield _per_tenant(
            "runwatch_runs_silent",
            f"Live runs (RUNNING, DEGRADED) whose newest fact is older than "
            f"{self.silent_after_s:g} s at the scrape, by tenant.",
            silent,
        )
        yield _per_tenant(
            "runwatch_runs_silent_max_age_seconds",
            "Age at the scrape (exporter's wall clock) of the oldest newest-fact among a "
            "tenant's live runs (event time, producer clock); 0 with none live.",
            oldest,
        )


def _per_tenant(name: str, doc: str, values: dict[str, int] | dict[str, float]) -> Metric:
    g = GaugeMetricFamily(name, doc, labels=["tenant"])
    for t, value in sorted(values.items()):
        g.add_metric([t], value)
    return g


def make_registry(
    store: ReadModel,
    top_tenants: int = 10,
    *,
    silent_after_s: float = SILENT_AFTER_S,
    clock: Callable[[], float] = time.time,
) -> CollectorRegistry:
    """A fresh registry holding only the projection collector (one per app or test)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = ProjectionCollector(store, top_tenants, silent_after_s=silent_after_s, clock=clock)
    registry.register(collector)  # type: ignore[arg-type]
    return registry


# --- serving ---------------------------------------------------------------------------
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_app(registry: CollectorRegistry, token: str | None = None) -> WsgiApp:
    """The WSGI app of ``/metrics``; with ``token``, only ``Bearer <token>`` gets it."""
    app: WsgiApp = make_wsgi_app(registry)
    if token is None:
        return app
    if not token or token != token.strip():
        raise ValueError("the metrics bearer token must be non-empty, without surrounding spaces")
    expected = hashlib.sha256(token.encode()).digest()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        digest = hashlib.sha256(given.strip().encode("latin-1")).digest()
        # fixed-length digests: the comparison takes the same time whatever was sent
        if hmac.compare_digest(digest, expected) and scheme.lower() == "bearer":
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("WWW-Authenticate", 'Bearer realm="runwatch metrics"'),
            ],
        )
        return [b"missing or invalid bearer token\n"]

    return guarded


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


def start_metrics_server(
    registry: CollectorRegistry, port: int, host: str = "127.0.0.1", token: str | None = None
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` on ``host:port`` (loopback by default) from a thread of its own.

    Returns the server (``server_address`` holds the bound port; ``shutdown()`` stops it)
    and its thread."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("MetricsServer", (_ThreadingServer,), {"address_family": family})
    server = make_server(
        host, port, metrics_app(registry, token), server_class, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics-exporter", daemon=True)
    thread.start()
    return server, thread
