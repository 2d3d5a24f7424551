"""``import_metrics`` on what real histories hold (#17 review): the eval set's size (the
reward-hacking detector's noise guess), a byte-order mark, and steps too large to count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producers.metrics_import import MAX_STEP, eval_items, import_metrics, row_kind


def _import(path: Path, **kw) -> tuple[list, object]:
    events: list = []
    report = import_metrics(path, run_id="r", tenant_id="t", write=events.extend, **kw)
    return events, report


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _evals(events: list) -> list[tuple[int, float, int]]:
    return [(e.step, e.score, e.n_items) for e in events if e.type == "EvalGateScored"]


@pytest.mark.parametrize(
    ("row", "items"),
    [
        ({"eval_reward": 0.4, "n_items": 200}, 200),
        ({"eval_reward": 0.4, "eval_samples": 1319.0}, 1319),
        ({"eval_reward": 0.4, "eval_num_samples": "500"}, 0),  # (a string: read_rows parses)
        # transformers' speed metrics: samples/s x runtime = the eval's samples
        ({"eval_reward": 0.4, "eval_runtime": 30.1, "eval_samples_per_second": 3.322}, 100),
        ({"eval_reward": 0.4, "eval_runtime": 30.1}, 0),
        ({"eval_reward": 0.4}, 0),
        ({"eval_reward": 0.4, "n_items": 0}, 0),
        ({"eval_reward": 0.4, "n_items": float("nan")}, 0),
        ({"eval_reward": 0.4, "n_items": 1e300}, 0),
        ({"eval_reward": 0.4, "n_items": True}, 0),
    ],
)
def test_the_eval_sets_size_is_read_where_the_row_has_it(row: dict, items: int) -> None:
    assert eval_items(row) == items


def test_trl_eval_rows_and_an_eval_file_carry_n_items(tmp_path: Path) -> None:
    """Every imported eval had n_items 0, so reward_hacking guessed 0.004 of noise."""
    rows = [{"step": s, "reward": 0.3, "loss": 0.1} for s in range(1, 21)]
    rows.insert(10, {"step": 10, "eval_reward": 0.41, "eval_loss": 0.0, "eval_runtime": 30.1,
                     "eval_samples_per_second": 6.645, "epoch": 0.5})  # fmt: skip
    rows.append({"step": 20, "eval_reward": 0.43, "eval_samples": 250})
    assert row_kind(rows[-1]) == "eval"  # a count is no training metric
    assert row_kind({"step": 3, "n_items": 100, "eval_reward": 0.1}) == "eval"
    evals_file = tmp_path / "evals.csv"
    evals_file.write_text("step,score,n_items\n15,0.42,300\n18,0.40,\n")
    events, _ = _import(_jsonl(tmp_path / "h.jsonl", rows), eval_file=evals_file)
    assert _evals(events) == [(10, 0.41, 200), (15, 0.42, 300), (18, 0.40, 0), (20, 0.43, 250)]


def test_a_csv_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Excel and pandas' ``utf-8-sig`` write one: the first column was '\\ufeffstep', so
    no row had a step."""
    path = tmp_path / "bom.csv"
    path.write_bytes("step,reward\n1,0.5\n2,0.6\n".encode("utf-8-sig"))
    events, report = _import(path)
    assert report.rows == 2 and report.skipped == 0
    assert [e.step for e in events if e.type == "TrainerStepCompleted"] == [1, 2]
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes('{"step": 1, "reward": 0.5}\n'.encode("utf-8-sig"))
    assert _import(jsonl)[1].rows == 1


def test_a_step_beyond_2_53_is_refused_with_its_reason(tmp_path: Path) -> None:
    """A step of 1e300 crashed the fold (OverflowError squaring it as a float)."""
    path = _jsonl(tmp_path / "h.jsonl", [
        {"step": 1e300, "reward": 0.1},
        {"step": MAX_STEP + 1, "reward": 0.1},
        {"step": MAX_STEP, "reward": 0.1},
    ])  # fmt: skip
    events, report = _import(path)
    assert report.rows == 1 and report.skipped == 2
    assert "h.jsonl:1: step ~1e300 is beyond 2**53" in report.issues[0]
    assert f"step {MAX_STEP + 1} is beyond 2**53" in report.issues[1]
    assert [e.step for e in events if e.type == "TrainerStepCompleted"] == [MAX_STEP]
    only = _jsonl(tmp_path / "only.jsonl", [{"step": 1e300, "reward": 0.1}])
    with pytest.raises(ValueError, match=r"no metric rows with a step .*beyond 2\*\*53"):
        _import(only)


def test_a_token_count_past_an_events_bound_stays_in_extra_and_the_step_is_kept(
    tmp_path: Path,
) -> None:
    """Found by review: a cumulative ``num_tokens`` past 2**53 - 1 (an event's integer
    bound) failed the whole step's events, the step fact the run controller counts too."""
    path = _jsonl(tmp_path / "h.jsonl", [
        {"step": 1, "reward": 0.1, "num_tokens": 2**60},
        {"step": 2, "reward": 0.2, "num_tokens": 5},
    ])  # fmt: skip
    events, report = _import(path)
    steps = [e for e in events if e.type == "TrainerStepCompleted"]
    assert [e.step for e in steps] == [1, 2] and report.skipped == 0
    assert steps[0].tokens_trained is None and dict(steps[0].extra)["num_tokens"] == 2.0**60
    assert steps[1].tokens_trained == 5


def test_an_integer_too_long_to_parse_is_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"step": 1' + "0" * 5000 + ', "reward": 0.1}\n{"step": 2, "reward": 0.2}\n')
    _, report = _import(path)
    assert report.rows == 1 and report.skipped == 1 and "h.jsonl:1:" in report.issues[0]


def test_an_imported_run_begins_at_its_first_row_and_ends_when_told(tmp_path: Path) -> None:
    """Found by review: an import wrote one ``RunSubmitted`` at the import's own time, after
    every fact of the history: the run showed SUBMITTED for good, and with no end its last
    step was never billed (1,160 GPU-s of 1,200). It now begins (submitted and started) at
    its first row; ``ended`` closes it at the last row."""
    import json

    from projections.run_state import RunStateFold
    from stream_processors.accounting.fold import AccountingFold

    path = tmp_path / "m.jsonl"
    path.write_text(
        "".join(
            json.dumps({"step": s, "timestamp": 1000.0 + 5 * s, "reward": 0.1, "timing_s/step": 5})
            + "\n"
            for s in range(1, 31)
        )
    )
    for ended, final in ((None, "RUNNING"), ("completed", "SUCCEEDED"), ("failed", "FAILED")):
        events: list = []
        import_metrics(path, run_id="r", tenant_id="t", write=events.extend, gpus=8, ended=ended)
        first = [e for e in events if e.type in ("RunSubmitted", "RunStarted")]
        assert [e.ts for e in first] == [1005.0, 1005.0]
        fold, state, changes = RunStateFold(), None, []
        state = fold.initial()
        for e in sorted(events, key=lambda e: (e.ts, e.seq)):
            state, out = fold.apply(state, e)
            changes += [o.to_state for o in out]
        assert changes[:2] == ["SUBMITTED", "RUNNING"] and state.machine.state == final, changes
        if ended == "completed":
            acct, billed = AccountingFold(), 0.0
            st = acct.initial()
            for e in events:
                st, out = acct.apply(st, e)
                billed = max(
                    [billed, *(dict(o.device_seconds_by_kind).get("gpu", 0.0) for o in out)]
                )
            assert billed == 30 * 5 * 8  # every step billed, the last one too
