"""Where a :class:`~runwatch.hosting.host.Host` keeps its state and positions.

- :class:`StateFiles`: the embedded processors' files, per fold a snapshot at
  ``<log>/_groups/<fold>.state.json`` — that fold's positions and every key's slot
  (base64 of the slot bytes) — and a journal of the commits since, one line each: its
  positions and the slots that changed (:mod:`runwatch.hosting.state_journal`).
- :class:`ReadModelState`: a read model (:class:`projections.store.ReadModel`): views,
  series points, fold states, fleet aggregates, held records and positions in one
  :meth:`~projections.store.ReadModel.commit` (one SQLite transaction).
- :class:`NoState`: nothing kept (a read-only replay).
"""

from __future__ import annotations

import base64
from typing import Any

from events.log.embedded import GROUPS_DIR, EmbeddedLog
from runwatch.hosting.core import FoldSet
from runwatch.hosting.ports import Commit, Loaded, Position
from runwatch.hosting.state_journal import FoldStateFile


class NoState:
    def load(self, folds: FoldSet) -> Loaded:
        return Loaded()

    def commit(self, commit: Commit) -> None:
        return None


class StateFiles:
    """One state per fold on an embedded log (see the module docstring): a snapshot and a
    journal of the commits since (:mod:`runwatch.hosting.state_journal`), so a commit
    writes what changed, not every key the fold holds. A fold's positions never run ahead
    of its slots: both are one journal line, appended after the derived events of what
    they reflect."""

    def __init__(self, log: EmbeddedLog) -> None:
        self.log = log
        self._inputs: dict[str, tuple[str, ...]] = {}
        self._files: dict[str, FoldStateFile] = {}

    def load(self, folds: FoldSet) -> Loaded:
        loaded = Loaded()
        directory = self.log.root / GROUPS_DIR
        sync = bool(getattr(self.log, "sync", True))
        for hf in folds:
            self._inputs[hf.name] = tuple(hf.fold.inputs)
            snapshot = directory / f"{hf.name}.state.json"
            state = self._files[hf.name] = FoldStateFile(snapshot, hf.name, sync=sync)
            state.load()
            loaded.fold_starts[hf.name] = dict(state.positions)
            try:
                loaded.fold_states[hf.name] = {
                    k: base64.b64decode(v, validate=True) for k, v in state.slots.items()
                }
            except ValueError as exc:
                raise state._damaged(state.snapshot, f"a slot is not base64 ({exc})") from None
        # the host reads each topic from where its furthest-behind fold stopped
        for topic, hosted in folds.routes.items():
            loaded.positions[(topic, 0)] = min(
                self._files[hf.name].positions.get(topic, 0) for hf in hosted
            )
        return loaded

    def commit(self, commit: Commit) -> None:
        for name, changed in commit.fold_states.items():
            state = self._files[name]
            starts = dict(state.positions)
            moved = False
            for topic in self._inputs[name]:
                at = commit.positions.get((topic, 0), 0)
                if at > starts.get(topic, 0):
                    starts[topic], moved = at, True
            if not changed and not moved:
                continue
            b64 = {key: base64.b64encode(raw).decode() for key, raw in changed.items()}
            state.commit(starts, b64)


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
