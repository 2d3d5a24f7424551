"""Which queued groups make the next batch (pure; no events, no I/O).

The contract a trainer relies on:

- a batch holds *exactly* ``batch_size`` sequences;
- a group is never split (all of its sequences or none);
- the batch lists its groups in arrival order;
- ``minimums`` (env id -> sequences, from ``min_batch_allocation``) are taken first, each
  env's oldest groups first; an env with a positive minimum and nothing queued means no
  batch yet (as in the reference server: the minimum is a promise to the trainer);
- the rest is filled oldest-first. When greedy oldest-first filling cannot land exactly on
  ``batch_size`` (mixed group sizes), an exact subset sum over the oldest
  :data:`SEARCH_WINDOW` groups is tried, preferring older groups.

Unlike the reference server's "packs of max group size", a group whose size divides
nothing in particular can still be served as long as some combination adds up; groups
that can never fit are found by :func:`unbatchable` and reported by the fold.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

#: How many of the oldest candidate groups the exact subset-sum fallback considers.
SEARCH_WINDOW = 512


class Queued(NamedTuple):
    """One group waiting in the queue: its id, env, size, the trainer step it was
    accepted under, and its arrival ordinal (its place in the queue forever)."""

    group_id: str
    env_id: int | None
    size: int
    step: int
    order: int


def subset_sum(sizes: Sequence[int], target: int) -> list[int] | None:
    """Positions in ``sizes`` summing exactly to ``target``, preferring earlier ones."""
    if target == 0:
        return []
    mask = (1 << (target + 1)) - 1
    reach = [1]  # reach[i]: bit j set if j is reachable with the first i sizes
    for size in sizes:
        prev = reach[-1]
        reach.append((prev | (prev << size)) & mask)
    if not (reach[-1] >> target) & 1:
        return None
    picked: list[int] = []
    j = target
    for i in range(len(sizes), 0, -1):
        if (reach[i - 1] >> j) & 1:
            continue  # reachable without item i-1: leave the later item out
        picked.append(i - 1)
        j -= sizes[i - 1]
    picked.reverse()
    return picked


def select_batch(
    queue: Sequence[Queued], batch_size: int, minimums: Mapping[int, int] | None = None
) -> tuple[int, ...] | None:
    """Ascending positions in ``queue`` of the next batch, or None if none can be formed."""
    if batch_size <= 0 or not queue:
        return None
    taken: set[int] = set()
    total = 0
    for env_id, minimum in sorted((minimums or {}).items()):
        if minimum <= 0:
            continue
        # the env's groups oldest first, read only as far as its minimum needs
        mine = ((i, g) for i, g in enumerate(queue) if g.env_id == env_id)
        first = next(mine, None)
        if first is None:
            return None
        got = 0
        for i, g in itertools.chain((first,), mine):
            if got >= minimum:
                break
            if total + g.size <= batch_size:
                taken.add(i)
                got += g.size
                total += g.size
    fixed = frozenset(taken)
    for i, g in enumerate(queue):
        if total == batch_size:
            break
        if i not in taken and total + g.size <= batch_size:
            taken.add(i)
            total += g.size
    if total != batch_size:
        if not _holds_at_least(queue, batch_size):
            return None
        fixed_total = sum(queue[i].size for i in fixed)
        candidates = list(
            itertools.islice((i for i, _ in enumerate(queue) if i not in fixed), SEARCH_WINDOW)
        )
        picked = subset_sum([queue[i].size for i in candidates], batch_size - fixed_total)
        if picked is None:
            return None
        taken = set(fixed) | {candidates[p] for p in picked}
    return tuple(sorted(taken))


def _holds_at_least(queue: Sequence[Queued], sequences: int) -> bool:
    """Whether the queue holds ``sequences`` sequences (reads only as far as needed)."""
    total = 0
    for g in queue:
        total += g.size
        if total >= sequences:
            return True
    return False


def unbatchable(queue: Sequence[Queued], batch_size: int) -> int | None:
    """Position of the oldest group that blocks batching, if the queue is clearly stuck.

    Called only after :func:`select_batch` failed. Stuck means: the oldest
    :data:`SEARCH_WINDOW` groups hold at least twice ``batch_size`` sequences and still
    no exact batch exists among them. The group blamed is the oldest whose size does not
    divide ``batch_size`` (such sizes need partners of matching remainders that are not
    there); if every size divides it, nothing is blamed (a batch will come).
    """
    window = tuple(itertools.islice(queue, SEARCH_WINDOW))
    if batch_size <= 0 or sum(g.size for g in window) < 2 * batch_size:
        return None
    for i, g in enumerate(window):
        if batch_size % g.size:
            return i
    return None
