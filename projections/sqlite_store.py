"""The durable read model: one SQLite file, views and positions in one transaction.

See :mod:`projections.store` for the contract (:class:`~projections.store.ReadModel`). One
writer (the read model's host), any number of reader threads and processes (WAL; a
connection per thread), so an API process can read a store another process is writing.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

from projections.store import Batch, Positions, ReadModel, Snapshot
from projections.views import Fleet, RunView, flat_points

#: A series point SQLite gives back as NULL: SQLite stores a NaN REAL as NULL, and no
#: other point is NULL (absent metrics are not written), so it is a NaN metric (a fact
#: worth reporting: a NaN loss) and reads back as one, as it does from memory.
_NAN = float("nan")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS positions (
  topic_partition TEXT PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, state TEXT, created_ts REAL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runs_by_tenant ON runs (tenant_id, created_ts, run_id);
CREATE UNIQUE INDEX IF NOT EXISTS runs_by_id_tenant ON runs (run_id, tenant_id);
CREATE TABLE IF NOT EXISTS series (
  run_id TEXT NOT NULL, metric TEXT NOT NULL, step INTEGER NOT NULL, value REAL,
  PRIMARY KEY (run_id, metric, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fold_state (fold TEXT NOT NULL, key TEXT NOT NULL, state BLOB NOT NULL,
  PRIMARY KEY (fold, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class SqliteReadModel(ReadModel):
    """A SQLite file. One writer (the engine), any number of reader threads/processes."""

    def __init__(self, path: str | Path) -> None:
        """Open (or create) the store at ``path``. ``ValueError`` naming the path when it
        cannot be one: another kind of file, or a place that cannot be written."""
        self.path = Path(path)
        self._local = threading.local()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            con = self._con()
            con.executescript(_SCHEMA)
            con.execute(
                "INSERT OR IGNORE INTO meta VALUES ('instance', ?)",
                (json.dumps(uuid.uuid4().hex),),
            )
            con.commit()
        except (sqlite3.DatabaseError, OSError) as exc:
            self._local = threading.local()  # no half-open connection kept
            raise ValueError(f"{self.path} cannot be a projection store: {exc}") from None

    def instance_id(self) -> str:
        """A random id made when this store file was created: a follower derives its
        consumer group from it, so a new (or rebuilt) store never inherits the committed
        offsets of another store's group and always starts from the beginning."""
        return str(self._meta("instance"))

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
            self._local.con = con
        return con

    def load(self) -> Snapshot:
        con = self._con()
        positions = dict(con.execute("SELECT topic_partition, next_offset FROM positions"))
        folds = {
            (f, k): bytes(s) for f, k, s in con.execute("SELECT fold, key, state FROM fold_state")
        }
        views = {
            r: RunView.from_doc(json.loads(d))
            for r, d in con.execute("SELECT run_id, doc FROM runs")
        }
        return Snapshot(positions, folds, views, self.fleet(), self._meta("held") or {})

    def _meta(self, key: str) -> Any:
        row = self._con().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def commit(self, batch: Batch) -> None:
        con = self._con()
        con.execute("BEGIN IMMEDIATE")
        try:
            con.executemany(
                "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?)",
                [
                    (v.run_id, v.tenant_id, v.state, v.created_ts, json.dumps(v.to_doc()))
                    for v in batch.views.values()
                ],
            )
            con.executemany(
                "INSERT OR REPLACE INTO series VALUES (?, ?, ?, ?)",
                flat_points(batch.points),
            )
            con.executemany(
                "INSERT OR REPLACE INTO fold_state VALUES (?, ?, ?)",
                [(f, k, s) for (f, k), s in batch.fold_states.items()],
            )
            if batch.fleet is not None:
                con.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('fleet', ?)",
                    (json.dumps(batch.fleet.to_doc()),),
                )
            if batch.held is not None:
                con.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('held', ?)", (json.dumps(batch.held),)
                )
            con.executemany(
                "INSERT OR REPLACE INTO positions VALUES (?, ?)", list(batch.positions.items())
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def get_run(self, run_id: str, tenant_id: str | None = None) -> RunView | None:
        con = self._con()
        if tenant_id is None:
            row = con.execute("SELECT doc FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        else:  # one seek of runs_by_id_tenant: a foreign run misses it like an unknown id
            row = con.execute(
                "SELECT doc FROM runs WHERE run_id = ? AND tenant_id = ?", (run_id, tenant_id)
            ).fetchone()
        return RunView.from_doc(json.loads(row[0])) if row else None

    def list_runs(self, tenant_id, offset, limit, state=None):  # type: ignore[no-untyped-def]
        where, args = [], []
        if tenant_id is not None:
            where.append("tenant_id = ?")
            args.append(tenant_id)
        if state is not None:
            where.append("state = ?")
            args.append(state)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        con = self._con()
        total = con.execute(f"SELECT count(*) FROM runs {clause}", args).fetchone()[0]
        rows = con.execute(
            f"SELECT doc FROM runs {clause} ORDER BY created_ts, run_id LIMIT ? OFFSET ?",
            [*args, limit, offset],
        ).fetchall()
        return [RunView.from_doc(json.loads(d)) for (d,) in rows], total

    def series(self, run_id, metrics, since_step=0, limit=10_000):  # type: ignore[no-untyped-def]
        con = self._con()
        return {
            m: [
                (s, _NAN if v is None else v)
                for s, v in con.execute(
                    "SELECT step, value FROM series WHERE run_id = ? AND metric = ? AND step >= ?"
                    " ORDER BY step LIMIT ?",
                    (run_id, m, since_step, limit),
                )
            ]
            for m in metrics
        }

    def all_series(self, run_id: str) -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {}
        for m, s, v in self._con().execute(
            "SELECT metric, step, value FROM series WHERE run_id = ? ORDER BY metric, step",
            (run_id,),
        ):
            out.setdefault(m, []).append((s, _NAN if v is None else v))
        return out

    def all_views(self) -> list[RunView]:
        return [
            RunView.from_doc(json.loads(d)) for (d,) in self._con().execute("SELECT doc FROM runs")
        ]

    def fleet(self) -> Fleet:
        doc = self._meta("fleet")
        return Fleet.from_doc(doc) if doc else Fleet()

    def positions(self) -> Positions:
        return dict(self._con().execute("SELECT topic_partition, next_offset FROM positions"))

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None
