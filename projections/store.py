"""Read-model backends behind one ABC: in-memory (tests, here) and SQLite (durable:
:class:`projections.sqlite_store.SqliteReadModel`).

The engine writes a :class:`Batch` — the changed run views, new series points, fold
states, fleet aggregates, held records and the *consumed positions* — with one
:meth:`ReadModel.commit`. The SQLite backend writes all of it in one transaction, so the
view and the offset it reflects can never disagree: after a crash the engine resumes from
the stored positions and records at or past them are applied exactly once; a record
before them is skipped, which makes replaying the same log into the same store a no-op.

Readers (the query API, the Prometheus exporter, ``runwatch audit verify``) only call the
read methods; the SQLite backend serves them from a separate connection per thread (WAL),
so an API process can read a store another process is writing.
"""

from __future__ import annotations

import abc
import json
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from projections.views import Fleet, Points, RunView

Positions = dict[str, int]  # "topic:partition" -> next offset to read


@dataclass
class Batch:
    views: dict[str, RunView] = field(default_factory=dict)
    points: Points = field(default_factory=dict)
    fold_states: dict[tuple[str, str], bytes] = field(default_factory=dict)
    fleet: Fleet | None = None
    positions: Positions = field(default_factory=dict)
    held: dict[str, Any] | None = None  # records held at the terminal barrier; None: unchanged


@dataclass
class Snapshot:
    positions: Positions
    fold_states: dict[tuple[str, str], bytes]
    views: dict[str, RunView]
    fleet: Fleet
    held: dict[str, Any]


def tenant_totals(views: list[RunView]) -> list[dict[str, Any]]:
    """Per-tenant aggregates, sorted by tenant id (runs summed in run-id order, so float
    sums are the same whatever order the backend returned them in)."""
    out: dict[str, dict[str, Any]] = {}
    for v in sorted(views, key=lambda v: v.run_id):
        t = out.setdefault(
            v.tenant_id,
            {
                "tenant_id": v.tenant_id,
                "runs": 0,
                "gpu_seconds_by_pool": {},
                "device_seconds_by_kind": {},
                "tokens_generated": 0,
                "tokens_trained": 0,
                "committed_steps": 0,
                "spend_usd": 0.0,
                "runs_by_state": {},
            },
        )
        t["runs"] += 1
        state = v.state or "UNKNOWN"
        t["runs_by_state"][state] = t["runs_by_state"].get(state, 0) + 1
        u = v.usage
        for pool, s in u.get("gpu_seconds_by_pool", {}).items():
            t["gpu_seconds_by_pool"][pool] = t["gpu_seconds_by_pool"].get(pool, 0.0) + s
        for kind, s in u.get("device_seconds_by_kind", {}).items():
            by_kind = t["device_seconds_by_kind"]
            by_kind[kind] = by_kind.get(kind, 0.0) + s
        for k in ("tokens_generated", "tokens_trained", "committed_steps", "spend_usd"):
            t[k] += u.get(k, 0)
    for t in out.values():
        steps = t["committed_steps"]
        t["cost_per_step_usd"] = t["spend_usd"] / steps if steps else None
    return [out[k] for k in sorted(out)]


class ReadModel(abc.ABC):
    # -- write side ------------------------------------------------------------------
    @abc.abstractmethod
    def load(self) -> Snapshot:
        """Everything the engine needs to resume."""

    @abc.abstractmethod
    def commit(self, batch: Batch) -> None:
        """Apply the batch atomically (views, points, fold states, fleet, positions)."""

    # -- read side -------------------------------------------------------------------
    @abc.abstractmethod
    def get_run(self, run_id: str, tenant_id: str | None = None) -> RunView | None:
        """The run, if it exists *and* belongs to ``tenant_id`` (``None``: any tenant).

        The tenant is part of the lookup, so a run of another tenant is not even read:
        it costs exactly what an id that does not exist costs (no timing oracle)."""

    @abc.abstractmethod
    def list_runs(
        self, tenant_id: str | None, offset: int, limit: int, state: str | None = None
    ) -> tuple[list[RunView], int]:
        """Runs ordered by (created_ts, run_id); ``tenant_id=None`` lists every tenant."""

    @abc.abstractmethod
    def series(
        self, run_id: str, metrics: tuple[str, ...], since_step: int = 0, limit: int = 10_000
    ) -> dict[str, list[tuple[int, float]]]: ...

    @abc.abstractmethod
    def all_views(self) -> list[RunView]: ...

    @abc.abstractmethod
    def fleet(self) -> Fleet: ...

    @abc.abstractmethod
    def positions(self) -> Positions: ...

    def tenants(self) -> list[dict[str, Any]]:
        return tenant_totals(self.all_views())

    def export(self) -> dict[str, Any]:
        """The whole projection as plain JSON data, in a canonical order (audit compare)."""
        runs = sorted(self.all_views(), key=lambda v: v.run_id)
        return {
            "runs": {v.run_id: v.to_doc() for v in runs},
            "series": {
                v.run_id: {
                    m: [list(p) for p in pts] for m, pts in self.all_series(v.run_id).items()
                }
                for v in runs
            },
            "fleet": self.fleet().to_doc(),
            "tenants": self.tenants(),
        }

    @abc.abstractmethod
    def all_series(self, run_id: str) -> dict[str, list[tuple[int, float]]]: ...

    def close(self) -> None:
        return None


class RunsContents(NamedTuple):
    """The per-run part of an in-memory read model: documents, series, fold states."""

    docs: dict[str, dict[str, Any]]
    series: dict[str, dict[str, dict[int, float]]]
    fold_states: dict[tuple[str, str], bytes]


class InMemoryReadModel(ReadModel):
    """Documents in dicts, copied at commit (readers never see half a batch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[str, dict[str, Any]] = {}
        self._series: dict[str, dict[str, dict[int, float]]] = {}
        self._folds: dict[tuple[str, str], bytes] = {}
        self._fleet: dict[str, Any] = Fleet().to_doc()
        self._positions: Positions = {}
        self._held: dict[str, Any] = {}

    def load(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                dict(self._positions),
                dict(self._folds),
                {k: RunView.from_doc(json.loads(json.dumps(d))) for k, d in self._docs.items()},
                Fleet.from_doc(json.loads(json.dumps(self._fleet))),
                json.loads(json.dumps(self._held)),
            )

    def commit(self, batch: Batch) -> None:
        docs = {k: json.loads(json.dumps(v.to_doc())) for k, v in batch.views.items()}
        fleet = json.loads(json.dumps(batch.fleet.to_doc())) if batch.fleet else None
        with self._lock:
            self._docs.update(docs)
            for run, per in batch.points.items():
                mine = self._series.setdefault(run, {})
                for metric, steps in per.items():
                    mine.setdefault(metric, {}).update(steps)
            self._folds.update(batch.fold_states)
            if fleet is not None:
                self._fleet = fleet
            self._positions.update(batch.positions)
            if batch.held is not None:
                self._held = json.loads(json.dumps(batch.held))

    def runs_contents(self) -> RunsContents:
        """Every run's document, series and fold states (what a key-sharded replay worker
        hands back; see :meth:`absorb_runs`)."""
        with self._lock:
            return RunsContents(dict(self._docs), dict(self._series), dict(self._folds))

    def absorb_runs(self, part: RunsContents) -> None:
        """Add another model's runs (a shard of the same log: its runs must be new here).
        Fleet and positions are not part of it: the caller commits their merge."""
        with self._lock:
            clash = self._docs.keys() & part.docs.keys()
            if clash:
                raise ValueError(f"runs already in this model: {sorted(clash)[:3]}")
            self._docs.update(part.docs)
            self._series.update(part.series)
            self._folds.update(part.fold_states)

    def get_run(self, run_id: str, tenant_id: str | None = None) -> RunView | None:
        with self._lock:
            doc = self._docs.get(run_id)
            if doc is None or (tenant_id is not None and doc["tenant_id"] != tenant_id):
                return None
            return RunView.from_doc(json.loads(json.dumps(doc)))

    def list_runs(self, tenant_id, offset, limit, state=None):  # type: ignore[no-untyped-def]
        with self._lock:
            docs = [
                d
                for d in self._docs.values()
                if (tenant_id is None or d["tenant_id"] == tenant_id)
                and (state is None or d["state"] == state)
            ]
        docs.sort(key=lambda d: (d["created_ts"] or 0.0, d["run_id"]))
        page = docs[offset : offset + limit]
        return [RunView.from_doc(json.loads(json.dumps(d))) for d in page], len(docs)

    def series(self, run_id, metrics, since_step=0, limit=10_000):  # type: ignore[no-untyped-def]
        with self._lock:
            per = self._series.get(run_id, {})
            return {
                m: sorted((s, v) for s, v in per.get(m, {}).items() if s >= since_step)[:limit]
                for m in metrics
            }

    def all_series(self, run_id: str) -> dict[str, list[tuple[int, float]]]:
        with self._lock:
            per = self._series.get(run_id, {})
            return {m: sorted(per[m].items()) for m in sorted(per)}

    def all_views(self) -> list[RunView]:
        with self._lock:
            return [RunView.from_doc(json.loads(json.dumps(d))) for d in self._docs.values()]

    def fleet(self) -> Fleet:
        with self._lock:
            return Fleet.from_doc(json.loads(json.dumps(self._fleet)))

    def positions(self) -> Positions:
        with self._lock:
            return dict(self._positions)
