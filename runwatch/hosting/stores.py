"""Where a :class:`~runwatch.hosting.host.Host` keeps its state and positions.

- :class:`StateFiles`: the embedded processors' files, one per fold at
  ``<log>/_groups/<fold>.state.json`` — that fold's positions and every key's slot
  (base64 of the slot bytes) together, written atomically (temp file, fsync, rename).
- :class:`ReadModelState`: a read model (:class:`projections.store.ReadModel`): views,
  series points, fold states, fleet aggregates, held records and positions in one
  :meth:`~projections.store.ReadModel.commit` (one SQLite transaction).
- :class:`NoState`: nothing kept (a read-only replay).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from events.log.embedded import GROUPS_DIR, EmbeddedLog
from events.log.segments import write_atomically
from runwatch.hosting.core import FoldSet
from runwatch.hosting.ports import Commit, Loaded, Position


class NoState:
    def load(self, folds: FoldSet) -> Loaded:
        return Loaded()

    def commit(self, commit: Commit) -> None:
        return None


class StateFiles:
    """One state file per fold on an embedded log (see the module docstring). A fold's
    positions in its file never run ahead of its slots: both are one atomic write, made
    after the derived events of what they reflect were appended."""

    def __init__(self, log: EmbeddedLog) -> None:
        self.log = log
        self._inputs: dict[str, tuple[str, ...]] = {}
        self._starts: dict[str, dict[str, int]] = {}
        self._slot_b64: dict[str, dict[str, str]] = {}

    def path(self, fold: str) -> Path:
        return self.log.root / GROUPS_DIR / f"{fold}.state.json"

    def load(self, folds: FoldSet) -> Loaded:
        loaded = Loaded()
        for hf in folds:
            self._inputs[hf.name] = tuple(hf.fold.inputs)
            try:
                doc = json.loads(self.path(hf.name).read_text())
            except FileNotFoundError:
                doc = {"positions": {}, "slots": {}}
            starts = {str(t): int(n) for t, n in doc["positions"].items()}
            b64 = {str(k): str(v) for k, v in doc["slots"].items()}
            self._starts[hf.name], self._slot_b64[hf.name] = starts, b64
            loaded.fold_starts[hf.name] = starts
            loaded.fold_states[hf.name] = {k: base64.b64decode(v) for k, v in b64.items()}
        # the host reads each topic from where its furthest-behind fold stopped
        for topic, hosted in folds.routes.items():
            loaded.positions[(topic, 0)] = min(self._starts[hf.name].get(topic, 0) for hf in hosted)
        return loaded

    def commit(self, commit: Commit) -> None:
        for name, changed in commit.fold_states.items():
            starts = self._starts[name]
            moved = False
            for topic in self._inputs[name]:
                at = commit.positions.get((topic, 0), 0)
                if at > starts.get(topic, 0):
                    starts[topic], moved = at, True
            if not changed and not moved:
                continue
            b64 = self._slot_b64[name]
            for key, raw in changed.items():
                b64[key] = base64.b64encode(raw).decode()
            doc = {"fold": name, "positions": starts, "slots": b64}
            write_atomically(self.path(name), json.dumps(doc, sort_keys=True).encode())


class ReadModelState:
    """A read model as a host's store (positions as ``topic:partition`` keys there)."""

    def __init__(self, store: Any) -> None:
        #: the :class:`projections.store.ReadModel`
        self.read_model = store

    def load(self, folds: FoldSet) -> Loaded:
        snap = self.read_model.load()
        positions: dict[Position, int] = {}
        for key, offset in snap.positions.items():
            topic, partition = key.rsplit(":", 1)
            positions[(topic, int(partition))] = offset
        states: dict[str, dict[str, bytes]] = {}
        for (fold, key), raw in snap.fold_states.items():
            states.setdefault(fold, {})[key] = raw
        return Loaded(positions=positions, fold_states=states, held=snap.held, snapshot=snap)

    def commit(self, commit: Commit) -> None:
        from projections.store import Batch

        batch = commit.view if commit.view is not None else Batch()
        batch.fold_states = {
            (fold, key): raw for fold, changed in commit.fold_states.items()
            for key, raw in changed.items()
        }  # fmt: skip
        batch.positions = {f"{t}:{p}": n for (t, p), n in commit.positions.items()}
        batch.held = commit.held
        self.read_model.commit(batch)
