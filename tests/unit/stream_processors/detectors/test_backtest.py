"""The backtest's report of what the fold dropped (#17 review): rows out of step order were
dropped silently while the report claimed the input's whole span."""

from __future__ import annotations

from stream_processors.detectors import RunHealthFold
from stream_processors.detectors.backtest import backtest
from tests.unit.stream_processors.detectors._builders import Run


def _steps(order: list[int]) -> list:
    run = Run()
    return [run.submitted(), *(run.step(s, reward_mean=0.3 + 0.001 * s) for s in order)]


def test_steps_in_order_are_all_folded() -> None:
    (report,) = backtest(_steps(list(range(1, 51))), RunHealthFold()).values()
    assert (report.first_step, report.last_step) == (1, 50)
    assert report.input_steps == (1, 50)
    assert (report.late_steps, report.late_events) == (0, 0)
    doc = report.as_dict()
    assert doc["steps"] == [1, 50] == doc["steps_in_input"]
    assert doc["late"] == {"steps": 0, "repeated_steps": 0, "events": 0}


def test_rows_newest_first_report_the_one_step_folded_and_the_rest_dropped() -> None:
    (report,) = backtest(_steps(list(range(50, 0, -1))), RunHealthFold()).values()
    # it said "steps 1-50" while the detectors saw step 50 alone
    assert (report.first_step, report.last_step) == (50, 50)
    assert report.input_steps == (1, 50)
    assert report.late_steps == 49 and report.late_events == 49
    doc = report.as_dict()
    assert doc["steps"] == [50, 50] and doc["steps_in_input"] == [1, 50]
    assert doc["late"] == {"steps": 49, "repeated_steps": 0, "events": 49}


def test_a_resumed_run_reports_its_repeated_steps() -> None:
    """Steps logged again after a resume from an earlier checkpoint are dropped, as a live
    run's are; the report counts them and keeps the span the detectors saw."""
    (report,) = backtest(_steps([*range(1, 31), *range(21, 61)]), RunHealthFold()).values()
    assert (report.first_step, report.last_step) == (1, 60) and report.input_steps == (1, 60)
    # steps 21-30 the second time: 21-29 below the highest folded (30), 30 at it
    assert (report.late_steps, report.repeated_steps, report.late_events) == (9, 1, 10)


def test_a_second_row_for_one_step_is_a_repeat_not_out_of_order() -> None:
    """TRL logs its evals (and its end-of-training summary) as rows of their own at the
    step of the training row before them: the importer's step event for such a row is a
    repeat the fold drops, which changes no span and needs no warning."""
    run = Run()
    events = [run.submitted()]
    for s in range(1, 41):
        events.append(run.step(s, reward_mean=0.3))
        if s % 10 == 0:
            events += [run.step(s), run.eval(s, 0.5)]  # the eval row: a step event, no metric
    (report,) = backtest(events, RunHealthFold()).values()
    assert (report.first_step, report.last_step) == report.input_steps == (1, 40)
    assert (report.late_steps, report.repeated_steps, report.late_events) == (0, 4, 4)
