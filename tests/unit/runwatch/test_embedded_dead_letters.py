"""The embedded host writes every dead letter once: one per fold that raised on a record,
one for a record that did not decode, none twice after a crash and a re-run.

Review finding: the host de-duplicated letters by one high-water mark per topic, so a
second fold's ``fold_failed`` letter on the same record, and a fold added later failing on
an older record, were dropped (the faust host sends one letter per fold). Real files: an
:class:`~events.log.embedded.EmbeddedLog` in ``tmp_path``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from events.catalog.trainer import TrainerStepCompleted
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC
from runwatch.hosting.embedded import EmbeddedHost

TOPIC = "runwatch.telemetry"


class Boom:
    """Counts a run's steps; raises on step ``bad``."""

    inputs = (TOPIC,)

    def __init__(self, name: str, bad: int) -> None:
        self.name, self.bad = name, bad

    def initial(self) -> int:
        return 0

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(self, state: int, event: EventBase) -> tuple[int, Sequence[EventBase]]:
        if event.step == self.bad:
            raise RuntimeError(f"{self.name} chokes on step {event.step}")
        return state + 1, ()

    def dump_state(self, state: int) -> bytes:
        return str(state).encode()

    def load_state(self, raw: bytes) -> int:
        return int(raw)


def _step(n: int) -> TrainerStepCompleted:
    return TrainerStepCompleted(
        event_id=uuid.UUID(int=n), tenant_id="t1", run_id="r1", step=n, ts=float(n),
        producer="p", seq=n, loss=0.1,
    )  # fmt: skip


def _log(root: Path) -> EmbeddedLog:
    """Steps 1..10 at offsets 0..9, then a malformed record at offset 10."""
    log = EmbeddedLog(root, sync=False)
    log.open_sync()
    log.append_events_sync([_step(i) for i in range(1, 11)])
    log.append_sync(TOPIC, b"r1", b"{not json")
    return log


def _letters(log: EmbeddedLog) -> list[tuple[str, int, str]]:
    out = []
    for rec in log.read_sync(DEAD_LETTER_TOPIC):
        doc = json.loads(rec.value)
        out.append((doc["kind"], doc["source_offset"], doc["reason"].split(" ")[0]))
    return out


ALL = [
    ("fold_failed", 2, "fold_a"),
    ("fold_failed", 2, "fold_b"),
    ("malformed_json", 10, "not"),
]


def test_two_folds_failing_on_one_record_write_two_letters(tmp_path: Path) -> None:
    log = _log(tmp_path)
    host = EmbeddedHost(log, [Boom("fold_a", 3), Boom("fold_b", 3)])
    host.run_once()
    assert host.host.fold_failures == 2
    assert _letters(log) == ALL and host.stats.dead_letters == 3
    EmbeddedHost(log, [Boom("fold_a", 3), Boom("fold_b", 3)]).run_once()  # a restart
    assert _letters(log) == ALL  # nothing twice


def test_a_fold_added_later_dead_letters_an_old_record(tmp_path: Path) -> None:
    log = _log(tmp_path)
    EmbeddedHost(log, [Boom("fold_a", 3), Boom("fold_b", 3)]).run_once()
    later = EmbeddedHost(log, [Boom("fold_a", 3), Boom("fold_b", 3), Boom("fold_c", 5)])
    later.run_once()  # fold_c starts from offset 0; the others skip what they folded
    assert later.host.fold_failures == 1
    assert _letters(log) == [*ALL, ("fold_failed", 4, "fold_c")]


def test_a_crash_before_the_checkpoint_writes_no_letter_twice(tmp_path: Path) -> None:
    """The letters are appended and their marks committed, then the process dies before
    the folds' checkpoint: the restart re-runs the batch and derives the same letters."""
    log = _log(tmp_path)
    folds = [Boom("fold_a", 3), Boom("fold_b", 3)]
    crashing = EmbeddedHost(log, folds)

    def crash() -> None:
        raise KeyboardInterrupt("killed before the checkpoint")

    crashing.host.checkpoint = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        crashing.run_once()
    assert _letters(log) == ALL
    restarted = EmbeddedHost(EmbeddedLog(tmp_path), [Boom("fold_a", 3), Boom("fold_b", 3)])
    restarted.run_once()
    assert restarted.host.fold_failures == 2  # the batch was folded again
    assert _letters(log) == ALL and restarted.stats.dead_letters == 0
