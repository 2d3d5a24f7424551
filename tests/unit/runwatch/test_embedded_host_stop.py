"""The embedded host obeys a stop request (``runwatch process``'s SIGTERM) within one batch,
however long the backlog (review finding 2: a tenant's flood kept it deaf for minutes),
and the next run goes on from what was committed."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from events import TrainerStepCompleted
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from runwatch.hosting.embedded import EmbeddedHost
from tests.event_samples import sample


class Counting:
    """A fold counting one run's events; sets ``stop`` at its first (a SIGTERM arriving
    while a long backlog is folded)."""

    name = "counting"
    inputs = ("runwatch.telemetry",)

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def initial(self) -> int:
        return 0

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(self, state: int, event: EventBase) -> tuple[int, Sequence[EventBase]]:
        self.stop.set()
        return state + 1, ()

    def dump_state(self, state: int) -> bytes:
        return str(state).encode()

    def load_state(self, raw: bytes) -> int:
        return int(raw)


def test_a_stop_request_ends_a_pass_after_the_batch_it_is_in(tmp_path: Path) -> None:
    log = EmbeddedLog(tmp_path / "log")
    log.open_sync()
    base = sample(TrainerStepCompleted)
    log.append_events_sync(
        [base.model_copy(update={"event_id": uuid.uuid4(), "step": i}) for i in range(1_000)]
    )
    stop = threading.Event()
    host = EmbeddedHost(log, [Counting(stop)], batch_records=100)
    host.stop = stop
    assert host.run_once().records == 100  # one batch, committed, then it stops
    stop.clear()
    host.stop = None
    again = EmbeddedHost(log, [Counting(threading.Event())], batch_records=100)
    assert again.run_once().records == 900  # from the committed positions: nothing twice
    (hosted,) = again.host.folds.hosted
    assert sum(hosted.slots[k].state for k in hosted.slots) == 1_000  # type: ignore[attr-defined]
