"""Paths a command cannot use are clear errors (exit 1), never "a bug in runwatch".

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
    assert main(["backtest", str(binary)]) == 1
    assert "is not UTF-8 text at byte 0" in capsys.readouterr().err
    log = tmp_path / "log"
    argv = ["import", "metrics", str(binary), "--to", str(log), "--run-id", "r1", "--tenant", "t"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "is not UTF-8 text" in err and "bug in runwatch" not in err
    assert not any(p.is_file() and p.stat().st_size for p in log.rglob("*"))  # nothing written
