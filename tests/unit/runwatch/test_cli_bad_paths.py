"""Paths a command cannot use are clear errors (exit 1; ``backtest`` 2, its 1 being a FAIL
verdict), never "a bug in runwatch".

Found by running every command on odd inputs: a ``--log`` that names a file (every
writer then failed inside the log with ``FileExistsError``), and a metrics file that is
not UTF-8 text (``runwatch backtest`` and ``runwatch import metrics`` failed with
``UnicodeDecodeError``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runwatch.cli.main import main

STORE = "cannot be a projection store"
CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "test.yaml"


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-dir"
    path.write_bytes(os.urandom(64))
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--config", str(CONFIG), "--log", "{file}"],
        ["process", "--log", "{file}", "--once"],
        ["run", "pause", "r1", "--log", "{file}"],
        ["resume", "--run-id", "r1", "--log", "{file}"],
    ],
    ids=["train", "process", "run", "resume"],
)
def test_a_log_that_is_a_file_is_a_clear_error(
    a_file: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = a_file.read_bytes()
    assert main([a.replace("{file}", str(a_file)) for a in argv]) == 1
    err = capsys.readouterr().err
    assert f"{a_file} is a file, not an embedded log directory" in err
    assert "bug in runwatch" not in err and a_file.read_bytes() == before


def test_a_metrics_file_that_is_not_text_is_a_clear_error(
    a_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "metrics.csv"
    binary.write_bytes(b"\xc2\x00\xff" * 100)
    assert main(["backtest", str(binary)]) == 2  # an error, not a FAIL verdict's 1
    assert "is not UTF-8 text at byte 0" in capsys.readouterr().err
    log = tmp_path / "log"
    argv = ["import", "metrics", str(binary), "--to", str(log), "--run-id", "r1", "--tenant", "t"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "is not UTF-8 text" in err and "bug in runwatch" not in err
    assert not any(p.is_file() and p.stat().st_size for p in log.rglob("*"))  # nothing written


@pytest.mark.parametrize(
    "text",
    ["", "step,reward\n", "reward,loss\n0.5,0.1\n0.6,0.2\n", '{"reward": 0.5}\n'],
    ids=["empty", "header-only", "no-step-column", "jsonl-no-step"],
)
def test_a_metrics_file_without_a_step_imports_nothing(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It wrote a run of one ``RunSubmitted`` and exited 0 (``backtest`` refused it)."""
    metrics = tmp_path / "metrics.csv"
    metrics.write_text(text)
    evals = tmp_path / "evals.csv"
    evals.write_text("step,score\n5,0.5\n")
    log = tmp_path / "log"
    argv = ["import", "metrics", str(metrics), "--to", str(log), "--run-id", "r1", "--tenant", "t"]
    assert main([*argv, "--eval-file", str(evals)]) == 1
    err = capsys.readouterr().err
    assert "no metric rows with a step" in err and "bug in runwatch" not in err
    assert not any(p.is_file() and p.stat().st_size for p in log.rglob("*"))  # nothing written
    assert main(["backtest", str(metrics)]) == 2  # an error, not a FAIL verdict's 1
    assert "no metric rows with a step" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "pause", ""],
        ["resume", "--run-id", ""],
        ["import", "metrics", "m.csv", "--to", "l", "--run-id", "", "--tenant", "t"],
        ["backtest", "m.csv", "--tenant", ""],
    ],
    ids=["run", "resume", "import", "backtest"],
)
def test_an_empty_id_on_the_command_line_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``run pause ''`` answered "cannot pause : no such run"."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "an id cannot be empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["replay", "{log}", "--store", "{file}"], STORE),
        (["audit", "verify", "--log", "{log}", "--store", "{file}"], STORE),
        (["schema", "export", "--out", "{file}"], "is a file, not a directory"),
    ],
    ids=["replay-store", "audit-store", "schema-out"],
)
def test_an_output_or_store_path_that_cannot_be_one_is_a_clear_error(
    a_file: Path,
    tmp_path: Path,
    argv: list[str],
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A store that is another kind of file (sqlite3.DatabaseError) or an --out that is a
    file (NotADirectoryError) ended as "a bug in runwatch"; the file is left as it was."""
    log = tmp_path / "log"
    log.mkdir()
    before = a_file.read_bytes()
    argv = [a.replace("{file}", str(a_file)).replace("{log}", str(log)) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert said in err and "bug in runwatch" not in err and a_file.read_bytes() == before


def test_a_canary_with_no_trainers_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """``--parallel 0`` waited forever for trainers that never started."""
    with pytest.raises(SystemExit) as exit_:
        main(["canary", "--parallel", "0"])
    assert exit_.value.code == 2 and "0 is not at least 1" in capsys.readouterr().err


def test_a_tracking_store_mlflow_refuses_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow 3 refuses a new file store unless told otherwise: that ended as "a bug in
    runwatch" (its exception out of the client's first call); now the reason, exit 1."""
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    rows = tmp_path / "metrics.csv"
    rows.write_text("step,reward\n1,0.5\n2,0.6\n")
    log = tmp_path / "log"
    imported = ["import", "metrics", str(rows), "--to", str(log), "--run-id", "x", "--tenant", "t"]
    assert main(imported) == 0
    capsys.readouterr()
    uri = f"file://{tmp_path / 'mlruns'}"
    assert main(["export", "mlflow", "x", "--log", str(log), "--tracking-uri", uri]) == 1
    err = capsys.readouterr().err
    assert f"MLflow refused {uri}" in err and "bug in runwatch" not in err
