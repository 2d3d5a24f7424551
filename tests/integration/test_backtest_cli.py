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
    assert proc.returncode == 1 and "pick one with --run-id" in proc.stderr


def test_bad_input_is_refused_with_a_reason(tmp_path: Path) -> None:
    proc = _runwatch("backtest", str(tmp_path / "missing.csv"))
    assert proc.returncode == 1 and "no such file or directory" in proc.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("loss,lr\n0.1,0.2\n")  # no step column: every row refused
    proc = _runwatch("backtest", str(empty))
    assert proc.returncode == 1 and "no metric rows with a step" in proc.stderr
    proc = _runwatch("backtest", str(DATA / "csv_kl_runaway.csv"), "--incident-step", "-3")
    assert proc.returncode == 1 and "--incident-step" in proc.stderr
