"""The fold's queue: a chunked immutable sequence that behaves as the tuple it replaces."""

from __future__ import annotations

import random

import pytest

from stream_processors.batching.backlog import CHUNK, EMPTY, Backlog
from stream_processors.batching.selection import Queued


def group(i: int, step: int = 0, size: int = 8) -> Queued:
    return Queued(f"g{i}", i % 3, size, step, i)


def test_an_empty_backlog():
    assert len(EMPTY) == 0 and not EMPTY and list(EMPTY) == [] and EMPTY == ()
    assert EMPTY.sequences == 0 and EMPTY.appended() is EMPTY
    with pytest.raises(IndexError):
        EMPTY[0]


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_match_a_tuple(seed):
    """Appends, removals at positions, stale splits and merges, checked against a plain
    tuple after every step (positions, slices, length, sequences, equality)."""
    rnd = random.Random(seed)
    model: tuple[Queued, ...] = ()
    backlog = EMPTY
    arrivals = 0
    for _ in range(300):
        op = rnd.random()
        if op < 0.5:
            new = [group(arrivals + k, step=arrivals // 50, size=rnd.choice([1, 2, 8]))
                   for k in range(rnd.choice([1, 1, 3, CHUNK + 5]))]  # fmt: skip
            arrivals += len(new)
            before = backlog
            backlog = backlog.appended(*new)
            model = (*model, *new)
            assert len(before) == len(model) - len(new)  # the old state is unchanged
        elif op < 0.8 and model:
            picked = sorted(rnd.sample(range(len(model)), min(len(model), rnd.randint(1, 9))))
            assert [backlog[i] for i in picked] == [model[i] for i in picked]
            backlog = backlog.without(picked)
            model = tuple(g for i, g in enumerate(model) if i not in set(picked))
        elif op < 0.9:
            cutoff = rnd.randint(0, arrivals // 50 + 1)
            kept, gone = backlog.split_off(lambda g, c=cutoff: g.step < c, older_than=cutoff)
            assert gone == [g for g in model if g.step < cutoff]
            backlog, model = kept, tuple(g for g in model if g.step >= cutoff)
        elif model:
            back = [g for g in model if rnd.random() < 0.2]
            model = tuple(g for g in model if g not in back)
            backlog = Backlog(model).merged(back)
            model = tuple(sorted((*model, *back), key=lambda g: g.order))
        assert backlog == model and list(backlog) == list(model)
        assert len(backlog) == len(model)
        assert backlog.sequences == sum(g.size for g in model)
        if model:
            i = rnd.randrange(len(model))
            assert backlog[i] == model[i] and backlog[-1] == model[-1]
            assert backlog[i : i + 7] == model[i : i + 7] and backlog[:3] == model[:3]


def test_split_off_looks_only_at_chunks_that_can_hold_old_groups():
    backlog = Backlog(group(i, step=i // CHUNK) for i in range(3 * CHUNK))
    seen: list[int] = []

    def is_gone(g: Queued) -> bool:
        seen.append(g.order)
        return g.order % 2 == 0

    kept, gone = backlog.split_off(is_gone, older_than=1)  # only chunk 0 has step 0
    assert len(seen) == CHUNK and len(gone) == CHUNK // 2
    assert len(kept) == 3 * CHUNK - CHUNK // 2
    same, none = backlog.split_off(is_gone, older_than=0)
    assert same is backlog and none == []


def test_appending_shares_every_chunk_but_the_last():
    """What makes an accepted group cheap at any backlog: the old chunks are reused."""
    backlog = Backlog(group(i) for i in range(10 * CHUNK + 3))
    grown = backlog.appended(group(99_999))
    assert all(a is b for a, b in zip(backlog._chunks[:-1], grown._chunks[:-1], strict=False))
    assert len(grown) == len(backlog) + 1 and grown[-1].group_id == "g99999"
