"""Usage facts are named by what they are, so each is billed once: no less, no more.

Accounting drops a ``UsageRecorded`` whose ``seq`` is not beyond its producer's last one (a
redelivery). Found by review, each failing before the fix:

- a hook restarted with its run (TRL resumed from a checkpoint, verl started again)
  counted ``seq`` from 0 under the same producer: its usage was taken for redeliveries
  (half of a 10-step run billed);
- ``runwatch import metrics`` numbered ``seq`` by place in the import: the second file of a
  split history was never billed, and a re-import with ``--eval-file`` (seqs shifted)
  billed the history again (1,150 of 1,000 GPU-seconds);
- ids of (run, step, kind) made a resumed history's repeated steps one fact, which the
  processors' host dropped by id within its window and the read model billed: 600 against
  700 GPU-seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events.catalog.usage import UsageRecorded
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from producers.hooks import RunwatchHook
from producers.metrics_import import ROW_SEQS, import_metrics
from producers.sinks import EmbeddedSink
from runwatch.hosting.host import Host
from runwatch.hosting.replay import rebuild_from_log
from runwatch.hosting.stores import NoState
from stream_processors.accounting import AccountingFold

STEP_S = 10.0  # each row: one step of 10 s on one GPU


def _history(path: Path, steps: list[int]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"step": s, "critic/score/mean": 0.1, "timing_s/step": STEP_S}) + "\n"
            for s in steps
        )
    )
    return path


def _billed(events: list[EventBase]) -> float:
    """GPU-seconds the accounting fold bills for the events (in order, one run)."""
    fold = AccountingFold()
    state = fold.initial()
    for ev in events:
        state, _ = fold.apply(state, ev)
    return state.gpu_seconds_trainer


def _import(path: Path, **kw: object) -> list[EventBase]:
    out: list[EventBase] = []
    import_metrics(path, run_id="r", tenant_id="t", write=out.extend, gpus=1, **kw)  # type: ignore[arg-type]
    return out


def test_a_split_history_is_billed_whole(tmp_path: Path) -> None:
    first = _import(_history(tmp_path / "a.jsonl", list(range(1, 51))))
    second = _import(_history(tmp_path / "b.jsonl", list(range(51, 101))))
    assert _billed(first + second) == 100 * STEP_S


def test_a_history_imported_again_grown_or_with_evals_is_billed_once(tmp_path: Path) -> None:
    whole = _history(tmp_path / "all.jsonl", list(range(1, 101)))
    half = _history(tmp_path / "half.jsonl", list(range(1, 51)))
    evals = tmp_path / "evals.jsonl"
    evals.write_text(
        "".join(json.dumps({"step": s, "score": 0.5}) + "\n" for s in range(1, 101, 2))
    )
    once = _import(whole)
    again = _import(whole, eval_file=evals)
    assert _billed(once + again) == 100 * STEP_S
    assert _billed(_import(half) + once) == 100 * STEP_S  # the history grew, then re-imported
    usage = {(e.event_id, e.producer, e.seq) for e in once if type(e) is UsageRecorded}
    assert usage == {(e.event_id, e.producer, e.seq) for e in again if type(e) is UsageRecorded}


def test_a_resumed_historys_repeated_steps_are_billed_and_only_once(tmp_path: Path) -> None:
    steps = [*range(1, 51), *range(41, 71)]  # crashed at 50, resumed from checkpoint 40
    events = _import(_history(tmp_path / "m.jsonl", steps))
    assert _billed(events) == len(steps) * STEP_S
    assert _billed(events + _import(tmp_path / "m.jsonl")) == len(steps) * STEP_S
    ids = [e.event_id for e in events]
    assert len(ids) == len(set(ids))
    lanes = {e.producer for e in events if type(e) is UsageRecorded}
    assert lanes == {"metrics-import", "metrics-import/lane-1"}


def test_the_processors_and_the_read_model_bill_a_resumed_history_alike(tmp_path: Path) -> None:
    steps = [*range(1, 51), *range(41, 71)]
    sink = EmbeddedSink(tmp_path / "log")
    import_metrics(_history(tmp_path / "m.jsonl", steps), run_id="r", tenant_id="t",
                   write=sink.write, gpus=1)  # fmt: skip
    sink.close()
    log = EmbeddedLog(tmp_path / "log", readonly=True)
    log.open_sync()
    host = Host([AccountingFold()], NoState())  # the processors' host: dedupe by event id
    host.process(list(log.iter_records()))
    view = rebuild_from_log(tmp_path / "log").host.view.views["r"]  # type: ignore[union-attr]
    assert host.states("accounting")["r"].gpu_seconds_trainer == len(steps) * STEP_S
    assert view.usage["gpu_seconds_by_pool"]["trainer"] == len(steps) * STEP_S


def test_a_row_yields_fewer_events_than_its_seqs(tmp_path: Path) -> None:
    """Seqs are ``ROW_SEQS x step + place``: a row with every kind of fact stays in its step."""
    row = {"step": 3, "critic/score/mean": 0.1, "timing_s/step": STEP_S,
           "response_length/mean": 100.0, "val-core/x/reward/mean@1": 0.4}  # fmt: skip
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    seqs = [e.seq for e in _import(path) if e.type not in ("RunSubmitted", "RunStarted")]
    assert len(seqs) == 5 and seqs == list(range(3 * ROW_SEQS + 1, 3 * ROW_SEQS + 6))


@pytest.mark.parametrize("restarts", [1, 2])
def test_a_restarted_hook_is_billed_for_every_step(tmp_path: Path, restarts: int) -> None:
    log = tmp_path / "log"
    step = 0
    for process in range(restarts + 1):
        hook = RunwatchHook(
            "r", "t", log=log, spool=tmp_path / f"spool{process}", gpus=1,
            install_exit_hooks=False,
        )  # fmt: skip
        if process:
            hook.start({}, resumed_from=f"out/checkpoint-{step}", resumed_step=step)
        for _ in range(5):
            step += 1
            hook.log({"reward": 0.1}, step=step)
            hook.step_done(step, wall_s=STEP_S)
        hook.close()
    reader = EmbeddedLog(log, readonly=True)
    reader.open_sync()
    events = [e for e in reader.iter_events(["runwatch.telemetry"]) if isinstance(e, EventBase)]
    producers = {e.producer for e in events}
    assert len(producers) == restarts + 1 and all(p.startswith("hook/r/") for p in producers)
    assert _billed(events) == step * STEP_S


def test_eval_and_summary_rows_at_their_steps_number_open_no_lane(tmp_path: Path) -> None:
    """Review of f8500a8: TRL logs its evals and its end-of-training summary as rows of
    their own at the step of the training row before them; they opened lanes (6 step
    events for a 4-step history, every later row under new ids)."""
    rows = [
        {"loss": 0.5, "reward": 0.1, "step": 1},
        {"loss": 0.4, "reward": 0.2, "step": 2},
        {"eval_loss": 0.3, "eval_reward": 0.25, "step": 2},
        {"loss": 0.3, "reward": 0.3, "step": 3},
        {"loss": 0.2, "reward": 0.4, "step": 4},
        {"train_runtime": 12.0, "train_loss": 0.35, "step": 4},
    ]
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = _import(path)
    assert {e.producer for e in events} == {"metrics-import", "metrics-import/lifecycle"}
    steps = {e.event_id: e.step for e in events if e.type == "TrainerStepCompleted"}
    assert sorted(steps.values()) == [1, 2, 3, 4]
