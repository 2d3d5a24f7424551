"""``runwatch backtest`` (seed 000's silent-failure replay) as a user runs it: real files
through the real CLI, as a subprocess. The cases are made by
``tests/data/backtest/make_cases.py`` (its docstring says what each one is): three runs the
current catalog pages on before the incident was noticed, and one it cannot see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stream_processors.detectors import load_catalog
from tests.data.backtest.make_cases import CASES

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "backtest"
#: case -> the paging detector that must fire first
FIRST_PAGE = {
    "trl_saturated_reward.jsonl": "reward_explosion_collapse",
    "verl_hacked_eval.jsonl": "reward_hacking",
    "csv_kl_runaway.csv": "kl_blowup",
}


def _runwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_backtest_case_pages_before_the_incident_or_exits_1(case: str) -> None:
    incident, must_page = CASES[case]
    extra = ["--gpus", "8"] if case.startswith("verl") else []
    proc = _runwatch("backtest", str(DATA / case), "--incident-step", str(incident), "--json",
                     *extra)  # fmt: skip
    assert proc.returncode == (0 if must_page else 1), proc.stderr
    doc = json.loads(proc.stdout)
    (run,) = doc["runs"]
    assert doc["passed"] is must_page and run["passed"] is must_page
    assert run["incident_step"] == incident
    assert run["config_version"] == load_catalog().version
    if not must_page:
        assert run["first_page"] is None
        # what it did say: the run had no eval gate, so hacking was undetectable
        assert [d["detector"] for d in run["detectors"]] == ["eval_gate_missing"]
        return
    page = run["first_page"]
    assert page["detector"] == FIRST_PAGE[case] and page["step"] < incident
    first = next(d for d in run["detectors"] if d["detector"] == page["detector"])
    assert first["lead_steps"] == incident - page["step"] and first["reason"]
    if extra:  # timing_s/step x 8 GPUs, priced from prices.yaml
        spend = run["spend_usd"]
        assert spend["before_first_page"] > 0 and spend["first_page_to_incident"] > 0
        steps = incident - page["step"]
        assert spend["first_page_to_incident"] == pytest.approx(steps * 60 * 8 * 0.00112)


def test_text_report_names_each_detector_and_the_verdict() -> None:
    proc = _runwatch("backtest", str(DATA / "trl_saturated_reward.jsonl"), "--incident-step",
                     "400")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "backtest of run trl_saturated_reward (jsonl " in out
    assert "| dead_run " in out and "| reward_explosion_collapse " in out
    assert "PASS: a page before the incident at step 400" in out
    proc = _runwatch("backtest", str(DATA / "trl_hacked_no_eval.jsonl"), "--incident-step", "320")
    assert proc.returncode == 1
    assert "no paging detector would have fired" in proc.stdout
    assert "FAIL: no page before the incident at step 320" in proc.stdout


def test_an_imported_log_gives_the_same_answer_as_the_file(tmp_path: Path) -> None:
    log = tmp_path / "log"
    case = DATA / "verl_hacked_eval.jsonl"
    for run_id in ("hacked", "other"):
        imported = _runwatch("import", "metrics", str(case), "--run-id", run_id, "--tenant", "t",
                             "--to", str(log), "--gpus", "8")  # fmt: skip
        assert imported.returncode == 0, imported.stderr
    from_file = json.loads(_runwatch("backtest", str(case), "--gpus", "8", "--json").stdout)
    proc = _runwatch("backtest", str(log), "--run-id", "hacked", "--incident-step", "320",
                     "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(proc.stdout)["runs"]
    assert run["run_id"] == "hacked" and run["tenant_id"] == "t"
    assert [(d["detector"], d["fired_at_step"]) for d in run["detectors"]] == [
        (d["detector"], d["fired_at_step"]) for d in from_file["runs"][0]["detectors"]
    ]
    # several runs in the log: an incident step needs the run named
    proc = _runwatch("backtest", str(log), "--incident-step", "320")
    assert proc.returncode == 2 and "pick one with --run-id" in proc.stderr


def test_bad_input_is_refused_with_a_reason_and_exit_2(tmp_path: Path) -> None:
    """A backtest that cannot be run exits 2: 1 is the FAIL verdict (no page came first),
    which a script must be able to tell from "no answer" (both were 1)."""
    proc = _runwatch("backtest", str(tmp_path / "missing.csv"))
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("loss,lr\n0.1,0.2\n")  # no step column: every row refused
    proc = _runwatch("backtest", str(empty))
    assert proc.returncode == 2 and "no metric rows with a step" in proc.stderr
    proc = _runwatch("backtest", str(DATA / "csv_kl_runaway.csv"), "--incident-step", "-3")
    assert proc.returncode == 2 and "--incident-step" in proc.stderr
    (tmp_path / "nothing.jsonl").write_text("")
    proc = _runwatch("backtest", str(tmp_path / "nothing.jsonl"), "--incident-step", "10")
    assert proc.returncode == 2 and "no metric rows with a step" in proc.stderr
    proc = _runwatch("backtest", str(tmp_path), "--sort-steps")
    assert proc.returncode == 2 and "--sort-steps sorts a metrics file" in proc.stderr


def test_rows_out_of_step_order_are_reported_and_sort_steps_folds_them(tmp_path: Path) -> None:
    """A history exported newest first: the fold dropped every row after the first as late
    while the report said "steps 1-449" and FAIL. Now the report says which steps the
    detectors saw and how many were dropped (text, --json, a warning), and --sort-steps
    folds the file in step order: the same answer as the file in its own order."""
    case = DATA / "trl_saturated_reward.jsonl"
    lines = case.read_text().splitlines(keepends=True)
    desc = tmp_path / "desc.jsonl"
    desc.write_text("".join(reversed(lines)))
    proc = _runwatch("backtest", str(desc), "--incident-step", "400")
    assert proc.returncode == 1
    first_line = proc.stdout.splitlines()[0]
    assert "steps 449-449 folded (1-449 in the input)" in first_line
    assert "warning: run desc: 448 trainer step(s) came below" in proc.stdout
    assert "--sort-steps" in proc.stdout
    proc = _runwatch("backtest", str(desc), "--incident-step", "400", "--json")
    (run,) = json.loads(proc.stdout)["runs"]
    assert run["steps"] == [449, 449] and run["steps_in_input"] == [1, 449]
    assert run["late"]["steps"] == 448 and "448 trainer step(s)" in proc.stderr
    assert run["late"]["repeated_steps"] == 0
    ordered = json.loads(
        _runwatch("backtest", str(case), "--incident-step", "400", "--json").stdout
    )
    proc = _runwatch("backtest", str(desc), "--incident-step", "400", "--json", "--sort-steps")
    assert proc.returncode == 0 and not proc.stderr
    doc = json.loads(proc.stdout)
    (run,) = doc["runs"]
    assert doc["sorted_steps"] is True
    assert run["late"] == {"steps": 0, "repeated_steps": 0, "events": 0}
    assert run["steps"] == run["steps_in_input"] == ordered["runs"][0]["steps"]
    assert [(d["detector"], d["fired_at_step"]) for d in run["detectors"]] == [
        (d["detector"], d["fired_at_step"]) for d in ordered["runs"][0]["detectors"]
    ]


def test_a_bom_csv_is_read_and_a_step_beyond_2_53_is_an_error(tmp_path: Path) -> None:
    bom = tmp_path / "bom.csv"
    rows = "".join(f"{s},0.0,0\n" for s in range(12))
    bom.write_bytes(("step,reward,reward_std\n" + rows).encode("utf-8-sig"))
    proc = _runwatch("backtest", str(bom), "--incident-step", "100")
    assert proc.returncode == 0, proc.stderr  # the constant reward pages dead_run
    assert "steps 0-11" in proc.stdout and "PASS" in proc.stdout
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"step": 1e+300, "reward": 0.0}\n')
    proc = _runwatch("backtest", str(huge))
    assert proc.returncode == 2 and "bug in runwatch" not in proc.stderr  # (OverflowError)
    assert "step ~1e300 is beyond 2**53" in proc.stderr
