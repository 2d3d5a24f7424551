"""Payload stores of the trajectory view: spill files are read back and cleaned up."""

from __future__ import annotations

import pytest

from projections.trajectory_view.store import MemoryPayloads, SpillPayloads


@pytest.mark.parametrize("kind", ["memory", "spill"])
def test_put_get_drop(kind, tmp_path):
    store = MemoryPayloads() if kind == "memory" else SpillPayloads(tmp_path / "p", 64)
    for i in range(10):
        store.put(f"g{i}", f'{{"i":{i}}}'.encode() * 5)
    assert store.get("g7") == b'{"i":7}' * 5 and len(store) == 10
    store.drop([f"g{i}" for i in range(8)] + ["unknown"])
    assert len(store) == 2 and store.get("g9") == b'{"i":9}' * 5
    with pytest.raises(KeyError):
        store.get("g0")
    if kind == "spill":  # fully dropped segments are deleted, the active one stays
        assert len(list((tmp_path / "p").iterdir())) <= 3
    store.clear()
    assert len(store) == 0
    store.close()
