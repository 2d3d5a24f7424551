"""A NaN metric (a NaN loss is a fact worth reporting) reads back from the SQLite read
model as NaN, as from memory: SQLite stores a NaN REAL as NULL. Found by the chaos test,
whose NaN probes made ``audit verify`` of a live store differ from its replay."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from projections.sqlite_store import SqliteReadModel
from projections.store import Batch, InMemoryReadModel


def test_nan_points_survive_the_sqlite_store(tmp_path: Path) -> None:
    points = {"r": defaultdict(dict, {"loss": {0: math.nan, 1: 0.5, 2: math.inf}})}
    for model in (SqliteReadModel(tmp_path / "v.sqlite"), InMemoryReadModel()):
        model.commit(Batch(points=points))
        ((nan, half, inf),) = model.series("r", ["loss"]).values()
        assert math.isnan(nan[1]) and half == (1, 0.5) and inf == (2, math.inf)
        assert math.isnan(model.all_series("r")["loss"][0][1])
