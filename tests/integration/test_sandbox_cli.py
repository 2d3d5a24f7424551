"""``runwatch sandbox check|score|features`` end to end (real sandboxes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runwatch.cli.main import main
from tests.integration.sandbox_support import require_sandbox, write_reward

pytestmark = pytest.mark.timeout(60)

GOOD = """
def reward(batch):
    return [len(x["completion"]) / 10 for x in batch]
"""


@pytest.fixture
def batch_file(tmp_path: Path) -> Path:
    p = tmp_path / "batch.jsonl"
    p.write_text('{"prompt": "a", "completion": "xx"}\n\n{"prompt": "b", "completion": "xxxx"}\n')
    return p


def test_score_json(tmp_path: Path, batch_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_sandbox()
    rc = main(
        [
            "sandbox",
            "score",
            str(write_reward(tmp_path, GOOD)),
            "--batch",
            str(batch_file),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["status"] == "ok" and doc["scores"] == [0.2, 0.4]
    assert doc["ledger"]["cause"] == "ok" and doc["ledger"]["duration_s"] > 0


def test_score_table_and_failure_exit_code(
    tmp_path: Path, batch_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_sandbox()
    src = "def reward(batch):\n    raise ValueError('boom')\n"
    rc = main(["sandbox", "score", str(write_reward(tmp_path, src)), "--batch", str(batch_file)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "| skipped | tenant_crash |" in out and "ValueError: boom" in out


def test_score_timeout_flag(
    tmp_path: Path, batch_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_sandbox()
    src = "import time\ndef reward(batch):\n    time.sleep(30)\n"
    rc = main(
        [
            "sandbox",
            "score",
            str(write_reward(tmp_path, src)),
            "--batch",
            str(batch_file),
            "--deadline",
            "0.5",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["ledger"]["cause"] == "tenant_timeout" and doc["scores"] is None


def test_bad_batch_lines_abort_with_line_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\nnot json\n')
    rc = main(["sandbox", "score", str(write_reward(tmp_path, GOOD)), "--batch", str(bad)])
    assert rc == 1
    assert f"{bad}:2: not JSON" in capsys.readouterr().err
    rc = main(["sandbox", "score", str(tmp_path / "missing.py"), "--batch", str(bad)])
    assert rc == 1 and "no such reward file" in capsys.readouterr().err


def test_check_passes_good_and_fails_bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_sandbox()
    assert main(["sandbox", "check", str(write_reward(tmp_path, GOOD))]) == 0
    assert capsys.readouterr().out.strip().endswith("PASSED")
    const = write_reward(tmp_path, "def reward(batch):\n    return [1.0] * len(batch)\n", "c.py")
    assert main(["sandbox", "check", str(const), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is False and any("constant" in f for f in doc["findings"])
    nondet = write_reward(
        tmp_path,
        "import os\ndef reward(b):\n    return [os.urandom(1)[0] / 255 for _ in b]\n",
        "n.py",
    )
    assert main(["sandbox", "check", str(nondet), "--json"]) == 1
    assert "non-deterministic" in capsys.readouterr().out
    invalid = write_reward(tmp_path, "def score(b):\n    return []\n", "i.py")
    assert main(["sandbox", "check", str(invalid), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "invalid" and "no module-level def reward" in doc["findings"][0]


def test_check_classifies_verifier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_sandbox()
    src = (
        "import subprocess, sys\n"
        "def reward(batch):\n"
        "    return [float(subprocess.run([sys.executable, '-c', 'pass']).returncode == 0)\n"
        "            + len(x['completion']) for x in batch]\n"
    )
    assert main(["sandbox", "check", str(write_reward(tmp_path, src)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "verifier" and doc["tier"] == "verifier"


def test_features(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "features", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["tiers"]) == {"function", "verifier"} and "seccomp" in doc["usable"]
