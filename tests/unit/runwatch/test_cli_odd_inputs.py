"""Every command on odd inputs: a clear error or a normal result, never "a bug in runwatch".

The sweep that found the faults ``test_cli_bad_paths.py`` pins (a ``--log`` or ``--out``
that is a file, a store that is not one, a metrics file that is not text, a tracking store
MLflow refuses, ``--parallel 0`` hanging), kept as a guard for the commands' next options:
missing paths, directories for files, files for directories, empty files and random
bytes, in-process through :func:`runwatch.cli.main.main`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runwatch.cli.main import main

CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "test.yaml"

CASES = [
    "train --config {missing} --log {dir}/l",
    "train --config {dir} --log {dir}/l",
    "train --config {empty} --log {dir}/l",
    "train --config {bytes} --log {dir}/l",
    "train --config {config} --log {bytes}",
    "resume --run-id x --log {missing}",
    "resume --run-id x --log {bytes}",
    "resume --run-id x --log {dir}",
    "checkpoint inspect {missing}",
    "checkpoint inspect {bytes}",
    "checkpoint inspect {dir}",
    "replay {missing}",
    "replay {bytes}",
    "replay {dir} --store {bytes}",
    "replay {dir} --catalog {bytes}",
    "replay {dir} --prices {bytes}",
    "replay {dir} --policy {bytes}",
    "backtest {missing}",
    "backtest {dir}",
    "backtest {bytes}",
    "backtest {empty}",
    "import metrics {bytes} --to {dir}/l --run-id a --tenant t",
    "import metrics {dir} --to {dir}/l --run-id a --tenant t",
    "import traces {bytes} --to {dir}/l --run-id a --tenant t",
    "import traces {dir} --to {dir}/l --run-id a --tenant t",
    "log cat {bytes}",
    "log cat {missing}",
    "profile {dir}",
    "profile {bytes}",
    "profile {missing}",
    "sandbox check {missing}",
    "sandbox check {dir}",
    "schema export --out {bytes}",
    "run pause x --log {bytes}",
    "run pause x --log {dir}",
    "notify --log {dir} --keys {missing}",
    "notify --log {dir} --keys {bytes}",
    "audit verify --log {dir} --store {bytes}",
    "audit verify --log {dir} --store {dir}",
    "process --log {bytes} --once",
    "process --log {dir} --once --catalog {bytes}",
    "process --log {dir} --once --control {bytes}",
]


@pytest.mark.parametrize("case", CASES)
def test_an_odd_input_is_never_a_bug(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = {
        "missing": tmp_path / "missing",
        "dir": tmp_path / "d",
        "empty": tmp_path / "empty.txt",
        "bytes": tmp_path / "bytes.bin",
        "config": CONFIG,
    }
    paths["dir"].mkdir()
    paths["empty"].write_bytes(b"")
    paths["bytes"].write_bytes(b"\xc2\x00" + os.urandom(2000))
    argv = case.format(**{k: str(v) for k, v in paths.items()}).split()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "bug in runwatch" not in err and "Traceback" not in err, err[-2000:]
    assert code in (0, 1, 2), (code, err[-500:])
