"""Payload stores of the trajectory view: spill files are read back and cleaned up."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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


def test_spill_writes_on_a_thread_while_the_loop_drops_and_reads(tmp_path):
    """put_many runs on the server's writer thread while the event loop serves and drops
    older payloads: every payload reads back intact, dropped segments go, none leak."""
    store = SpillPayloads(tmp_path / "p", segment_bytes=4096)
    chunks = [
        [(f"g{c}-{i}", f"payload {c} {i} ".encode() * 20, None) for i in range(10)]
        for c in range(40)
    ]
    with ThreadPoolExecutor(1) as writer:
        pending = [writer.submit(store.put_many, chunk) for chunk in chunks]
        for c, (chunk, fut) in enumerate(zip(chunks, pending, strict=True)):
            fut.result()
            for gid, payload, _ in chunk:
                assert store.get(gid) == payload
            if c % 2:  # the loop drops what it served while the writer goes on
                store.drop(gid for gid, _, _ in chunks[c - 1] + chunk)
    assert len(store) == 0
    assert len(list((tmp_path / "p").iterdir())) == 1  # only the active segment is left
    store.close()


def test_a_closed_spill_store_ignores_late_drops(tmp_path):
    """A failing push may drop its cached copies after the server closed the store."""
    store = SpillPayloads(tmp_path / "p", keep_files=True)
    store.put_many([("a", b"x" * 10, None), ("b", b"y" * 10, None)])
    store.close()
    store.drop(["a", "b"])  # no KeyError, and the kept files stay
    assert len(store) == 0 and list((tmp_path / "p").iterdir())
