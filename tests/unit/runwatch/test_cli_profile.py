"""``runwatch import traces`` and ``runwatch profile`` end to end on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producers.trace_synth import write_synthetic_traces
from runwatch.cli.main import main

PNG = b"\x89PNG\r\n\x1a\n"
PLOTS = {"cdf_steps.png", "cdf_workers_step3.png", "event_share.png", "turns.png", "step_times.png"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("traces") / "exp-1"
    write_synthetic_traces(
        root,
        steps=5,
        workers=4,
        requests_per_worker=40,
        abort_share=0.1,
        straggler=(3, 2, 5.0),
        seed=7,
    )
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_profile_a_trace_dir_writes_json_and_every_plot(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "profile", str(traces), "--out", str(tmp_path / "p"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    (run,) = doc["runs"]
    assert run["run_id"] == "exp-1" and doc["kind"] == "trace-dir"
    assert [s["step"] for s in run["steps"]] == [1, 2, 3, 4, 5]
    assert [(s["step"], s["worker"]) for s in run["stragglers"]] == [(3, "2")]
    assert run["focus_step"] == 3
    assert all(s["aborted_share"] == pytest.approx(0.1) for s in run["steps"])
    assert len(run["rollout_batches"]) == 5
    assert doc["import"]["skipped"] == 0
    assert {Path(p).name for p in run["plots"]} == PLOTS
    for name in PLOTS:
        data = (tmp_path / "p" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name


def test_import_then_profile_the_log_gives_the_same_profile(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "log")
    code, out, err = run_cli(
        capsys,
        "import",
        "traces",
        str(traces),
        "--run-id",
        "exp-1",
        "--tenant",
        "acme",
        "--to",
        log,
    )
    assert code == 0, err
    assert "imported" in out and "0 skipped" in out
    # importing twice appends duplicates; the profile deduplicates them by event id
    assert (
        run_cli(
            capsys,
            "import",
            "traces",
            str(traces),
            "--run-id",
            "exp-1",
            "--tenant",
            "acme",
            "--to",
            log,
        )[0]
        == 0
    )
    code, out, _ = run_cli(capsys, "profile", log, "--no-plots", "--json")
    from_log = json.loads(out)
    code2, out2, _ = run_cli(
        capsys, "profile", str(traces), "--no-plots", "--json", "--tenant", "acme"
    )
    from_dir = json.loads(out2)
    assert code == code2 == 0
    assert from_log["duplicates"] > 0 and from_log["kind"] == "log"
    assert from_log["runs"][0]["steps"] == from_dir["runs"][0]["steps"]
    assert from_log["runs"][0]["stragglers"] == from_dir["runs"][0]["stragglers"]


def test_profile_tables_name_the_straggler(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        capsys, "profile", str(traces), "--out", str(tmp_path / "p"), "--step", "2"
    )
    assert code == 0
    assert "straggler workers" in out and "avg % of total time" in out
    assert "workers of step 2" in out
    assert "plot: " + str(tmp_path / "p" / "cdf_workers_step2.png") in out
    assert (tmp_path / "p" / "cdf_workers_step2.png").stat().st_size > 0


def test_bad_lines_are_reported_and_the_rest_is_profiled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "exp"
    write_synthetic_traces(root, steps=2, workers=2, requests_per_worker=5)
    victim = root / "step_2" / "worker_1.jsonl"
    with victim.open("a") as fh:
        fh.write('{"timestamp": "2025-08-11T23:19:45", "event": "x", "duration_sec": -1}\n')
        fh.write("{oops\n")
    n_lines = len(victim.read_text().splitlines())
    code, out, err = run_cli(capsys, "profile", str(root), "--no-plots")
    assert code == 0
    assert f"{victim}:{n_lines - 1}: negative_duration" in err
    assert f"{victim}:{n_lines}: bad_json" in err
    assert "2 step(s) profiled" in out
    code, out, err = run_cli(
        capsys,
        "import",
        "traces",
        str(root),
        "--run-id",
        "r",
        "--tenant",
        "t",
        "--to",
        str(tmp_path / "log"),
        "--strict",
    )
    assert code == 1 and "2 skipped" in out and "bad_json" in err


def test_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], traces: Path) -> None:
    code, _, err = run_cli(capsys, "profile", str(tmp_path / "nothing"))
    assert code == 1 and "neither an embedded log nor a step_<N>/ trace directory" in err
    code, _, err = run_cli(capsys, "profile", str(traces), "--no-plots", "--step", "99")
    assert code == 1 and "has no step 99" in err
    code, _, err = run_cli(
        capsys,
        "import",
        "traces",
        str(tmp_path),
        "--run-id",
        "r",
        "--tenant",
        "t",
        "--to",
        str(tmp_path / "log"),
    )
    assert code == 1 and "no trace files" in err


def test_several_runs_in_one_log_get_one_section_and_plot_dir_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "log")
    for run, seed in (("run-a", 1), ("run-b", 2)):
        src = tmp_path / run
        write_synthetic_traces(src, steps=2, workers=2, requests_per_worker=6, seed=seed)
        code, _, err = run_cli(
            capsys, "import", "traces", str(src), "--run-id", run, "--tenant", "acme", "--to", log
        )
        assert code == 0, err
    code, out, _ = run_cli(capsys, "profile", log, "--out", str(tmp_path / "p"), "--json")
    assert code == 0
    runs = json.loads(out)["runs"]
    assert [r["run_id"] for r in runs] == ["run-a", "run-b"]
    for r in runs:
        assert {Path(p).parent.name for p in r["plots"]} == {r["run_id"]}
        assert all(Path(p).stat().st_size > 0 for p in r["plots"])
    code, out, _ = run_cli(capsys, "profile", log, "--run-id", "run-b", "--no-plots", "--json")
    assert [r["run_id"] for r in json.loads(out)["runs"]] == ["run-b"]


def test_a_log_holding_only_derived_profiles_is_shown_as_it_is(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An auditor's export of runwatch.profiles (no traces) still prints the profile."""
    from events.log.embedded import EmbeddedLog
    from producers.trace_import import ImportReport, iter_trace_events
    from stream_processors.profiling import ProfilingFold

    fold = ProfilingFold()
    state, derived = fold.initial(), []
    rep = ImportReport()
    for ev in iter_trace_events(traces, run_id="exp-1", tenant_id="acme", report=rep):
        state, out = fold.apply(state, ev)
        derived.extend(out)
    derived.extend(fold.flush(state)[1])
    log = EmbeddedLog(tmp_path / "derived")
    log.open_sync()
    log.append_events_sync(derived)
    code, out, _ = run_cli(capsys, "profile", str(tmp_path / "derived"), "--no-plots", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "log-profiles"
    assert [(s["step"], s["worker"]) for s in doc["runs"][0]["stragglers"]] == [(3, "2")]
    assert len(doc["runs"][0]["rollout_batches"]) == 5


def test_another_tenants_traces_on_a_run_id_are_not_profiled(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round four, second pass: another tenant's imported traces on the run id made
    stragglers and steps in the run's profile (the processors refused them already)."""
    log = str(tmp_path / "log")
    for tenant, src in (("acme", traces), ("mallory", tmp_path / "other")):
        if tenant == "mallory":
            write_synthetic_traces(src, steps=6, workers=3, requests_per_worker=5, seed=9)
        code, _, err = run_cli(capsys, "import", "traces", str(src), "--run-id", "exp-1",
                               "--tenant", tenant, "--to", log)  # fmt: skip
        assert code == 0, err
    code, out, err = run_cli(capsys, "profile", log, "--no-plots", "--json")
    mixed = json.loads(out)
    code2, out2, _ = run_cli(
        capsys, "profile", str(traces), "--no-plots", "--json", "--tenant", "acme"
    )
    alone = json.loads(out2)
    assert code == code2 == 0 and mixed["foreign"] > 0 and "another tenant" in err
    assert mixed["runs"][0]["steps"] == alone["runs"][0]["steps"]
