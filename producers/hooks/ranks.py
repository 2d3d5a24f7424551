"""Process zero's word on a run's commands, shared with every rank of a multi-process run.

In a multi-process run (``torchrun``/``accelerate launch``: DDP, FSDP, DeepSpeed) only
process zero has a hook and reads the run's commands; the other ranks must pause and stop
with it, or they would hang at their next collective (a pause) or train on alone (a
cancel). :class:`WorldVerdict` makes the step boundary one more collective of the
world's default process group:

- process zero decides (its hook's ``obey``) and broadcasts ``GO`` or ``STOP``; every
  other rank waits for that broadcast and does the same;
- while process zero is paused it broadcasts ``HOLD`` at least every ``heartbeat_s`` and
  the others wait again: a pause of any length never reaches the process group's timeout
  (``TrainingArguments.ddp_timeout``, 1,800 s by default; ``heartbeat_s`` is a quarter of
  it, at most :data:`HEARTBEAT_S`).

Every rank must hold the callback: a broadcast of process zero's that another rank does
not make would pair with that rank's own next collective (DDP's, accelerate's) and kill
the job. So before the first verdict the ranks that hold it say so in the process group's
store (a key-value store every rank already reaches; no collective): process zero waits up
to :data:`JOIN_WAIT_S` for all of them and writes whether the verdict is shared. If a rank
lacks the callback, none broadcasts and process zero says so (the run's commands are then
not followed there: put the callback on every rank).

Assumptions: every rank holding the callback calls :meth:`WorldVerdict.share` at the same
step boundaries (the framework's callbacks run on every rank, in lockstep); the default
process group is initialized (the framework did it), has a store, and rank 0 is process
zero. The tensor lives where the
backend wants it: on the current CUDA device for NCCL, on the CPU otherwise. Cost: one
broadcast of one integer per step (it synchronizes the ranks at the step's end, where DDP
has already synchronized them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("runwatch.hooks")

#: what process zero says at a step boundary
GO, HOLD, STOP = 0, 1, 2
#: the longest time between two ``HOLD`` broadcasts of a paused process zero (seconds)
HEARTBEAT_S = 10.0
#: how long process zero waits for every rank to say it holds the callback (seconds)
JOIN_WAIT_S = 30.0


def world_size() -> int:
    """Processes in the default process group; 1 when there is none."""
    try:
        import torch.distributed as dist
    except ImportError:  # a torch without distributed support
        return 1
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return int(dist.get_world_size())


class WorldVerdict:
    """One step boundary's verdict, broadcast from rank 0 (the module docstring)."""

    def __init__(self, timeout_s: float | None = None) -> None:
        """``timeout_s``: the process group's timeout (the heartbeat is a quarter of it)."""
        import torch
        import torch.distributed as dist

        self._dist = dist
        self.rank = int(dist.get_rank())
        self.heartbeat_s = HEARTBEAT_S if not timeout_s else min(HEARTBEAT_S, timeout_s / 4)
        backend = str(dist.get_backend())
        cuda = "nccl" in backend and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self._word = torch.zeros(1, dtype=torch.int64, device=device)
        self._last = time.monotonic()
        #: broadcasts so far (rank 0: sent; others: received), for tests and logs
        self.said = 0

    def share(self, decide: Callable[[Callable[[], None]], bool]) -> bool:
        """Rank 0: ``decide(keepalive)`` (True: stop), broadcast; other ranks: wait for
        rank 0's verdict. Every rank answers the same: stop training?"""
        if self.rank != 0:
            return self._receive()
        self._last = time.monotonic()
        try:
            stop = decide(self.keepalive)
        except BaseException:
            self._send(STOP)  # the others must not wait for a verdict that never comes
            raise
        self._send(STOP if stop else GO)
        return stop

    def keepalive(self) -> None:
        """Rank 0, while paused: ``HOLD`` once ``heartbeat_s`` passed since the last word."""
        if time.monotonic() - self._last >= self.heartbeat_s:
            self._send(HOLD)

    def _send(self, word: int) -> None:
        self._word.fill_(word)
        self._dist.broadcast(self._word, src=0)
        self._last = time.monotonic()
        self.said += 1

    def _receive(self) -> bool:
        while True:
            self._dist.broadcast(self._word, src=0)
            self.said += 1
            word = int(self._word.item())
            if word != HOLD:
                return word == STOP


def world_verdict(args: Any, name: str, join_wait_s: float = JOIN_WAIT_S) -> WorldVerdict | None:
    """The verdict sharer of a run launched as several processes (``args``: the
    framework's ``TrainingArguments``; its ``ddp_timeout`` sets the heartbeat), or None
    for one process, a world without an initialized process group, or one where not every
    rank holds the callback (:func:`all_ranks_join`). ``name``: the same on every rank
    and new for every training run of the processes (the run id and a count)."""
    if world_size() <= 1:
        return None
    if not all_ranks_join(name, join_wait_s):
        return None
    timeout = getattr(args, "ddp_timeout", None)
    return WorldVerdict(float(timeout) if timeout else None)


def all_ranks_join(name: str, wait_s: float = JOIN_WAIT_S) -> bool:
    """Does every rank hold the callback? Each rank that does adds itself under ``name``
    in the process group's store; process zero waits up to ``wait_s`` for all and writes
    the answer, which the others read (the store's own timeout bounds their wait). No
    collective: a rank without the callback takes no part. False, said by process zero,
    when a rank is missing or there is no store."""
    import torch.distributed as dist

    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception as exc:  # no store: nothing to agree through
        log.warning("runwatch: no process group store (%s): commands are not followed", exc)
        return False
    members, answer = f"runwatch/{name}/members", f"runwatch/{name}/shared"
    size = dist.get_world_size()
    joined = store.add(members, 1)
    if dist.get_rank() != 0:
        return store.get(answer) == b"1"
    deadline = time.monotonic() + wait_s
    while joined < size and time.monotonic() < deadline:
        time.sleep(0.05)
        joined = store.add(members, 0)
    store.set(answer, b"1" if joined >= size else b"0")
    if joined < size:
        log.warning(
            "runwatch: the callback is on %d of %d ranks: the run's commands are not "
            "followed (a pause or cancel of process zero alone would hang the others); "
            "add RunwatchCallback on every rank",
            joined,
            size,
        )
    return joined >= size
