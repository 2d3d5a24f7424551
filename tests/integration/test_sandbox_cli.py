"""``runwatch sandbox check|score|features`` end to end (real sandboxes)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
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
    assert rc == 2  # an unusable batch file: nothing was run
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


# -- a hostile batch file: a clear error and exit 2, never a traceback (#20 item 6) -------

REPO = Path(__file__).resolve().parents[2]
DEEP = b'{"prompt": "p", "completion": "c", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"
HOSTILE_BATCHES = {
    # (file bytes, what stderr must say)
    "bad_utf8": (
        b'{"prompt": "a", "completion": "b"}\n{"prompt": "\xff\xfe", "completion": ""}\n',
        ":2: not UTF-8 text (invalid start byte at byte 47)",
    ),
    "bad_utf8_first_line": (b"\xc3\x28\n", ":1: not UTF-8 text"),
    "deeply_nested_json": (DEEP, ":1: JSON nested too deeply"),
    "deeply_nested_array_line": (
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
        ":1: JSON nested too deeply",
    ),
    "nested_beyond_the_contract": (
        b'{"prompt": "p", "completion": "c", "x": ' + b"[" * 100 + b"]" * 100 + b"}\n",
        ":1: line.x[0]",
    ),
    "nan_field": (b'{"prompt": "p", "completion": "c", "w": NaN}\n', ":1: line.w: nan is not JSON"),
    "lone_surrogate": (b'{"prompt": "\\ud800", "completion": "c"}\n', "lone surrogate"),
    "not_an_object": (b"[1, 2]\n", ":1: expected an object, got list"),
    "empty": (b"\n\n", "empty batch"),
    # not JSON at all, or not JSON lines (#19 item 4)
    "gzip": (gzip.compress(b'{"prompt": "a", "completion": "b"}\n'), ":1: not UTF-8 text"),
    "plain_text": (b"the answer is 4\n", ":1: not JSON"),
    "nul_bytes": (b"\x00" * 64, ":1: not JSON"),
    "truncated_line": (
        b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", "comp',
        ":2: not JSON",
    ),
    "one_pretty_json_document": (
        b'[\n  {"prompt": "a", "completion": "b"}\n]\n',
        ":1: not JSON",
    ),
    "integer_beyond_json": (
        b'{"prompt": "p", "completion": "c", "n": ' + b"1" * 5000 + b"}\n",
        ":1: not JSON",
    ),
}


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", "sandbox", *args],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize("case", sorted(HOSTILE_BATCHES))
def test_hostile_batch_files_are_refused_by_the_real_cli(tmp_path: Path, case: str) -> None:
    """The real CLI, as a subprocess: bad UTF-8 or deeply nested JSON used to escape as a
    traceback ("unexpected failure (a bug in runwatch)"); now the file, the line and the
    reason go to stderr and the exit code is 2, with nothing run."""
    data, why = HOSTILE_BATCHES[case]
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(data)
    for extra in ([], ["--json"]):
        proc = _cli("score", str(write_reward(tmp_path, GOOD)), "--batch", str(batch), *extra)
        err = proc.stderr.decode("utf-8")
        assert "Traceback" not in err and "a bug in runwatch" not in err, err[-2000:]
        assert proc.returncode == 2, err
        assert err.startswith(f"error: {batch}") and why in err, err
        assert err.count("\n") == 1 and len(err) < 500  # one clear line
        assert proc.stdout == b""


@pytest.mark.parametrize("where", ["directory", "dev_zero"])
def test_a_batch_path_that_is_no_file_is_refused(tmp_path: Path, where: str) -> None:
    """A directory, or a "file" without end (/dev/zero): read within a bound, refused with
    exit 2 and one line, never a traceback or a process that eats memory until killed."""
    batch = tmp_path if where == "directory" else Path("/dev/zero")
    proc = _cli("score", str(write_reward(tmp_path, GOOD)), "--batch", str(batch))
    err = proc.stderr.decode("utf-8")
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert err.startswith("error: ") and str(batch) in err and err.count("\n") == 1, err
    assert ("Is a directory" if where == "directory" else "larger than") in err


def test_a_line_with_a_raw_line_separator_inside_a_string_is_one_line(tmp_path: Path) -> None:
    """U+2028 and U+0085 are valid raw inside a JSON string; the batch reader used
    to split lines there too (str.splitlines) and refuse a valid file as "not JSON"."""
    require_sandbox()
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"prompt": "a\u2028b\x85c", "completion": "xyz"}\n', "utf-8")
    assert "\u2028" in batch.read_text("utf-8")  # raw, not an escape
    proc = _cli("score", str(write_reward(tmp_path, GOOD)), "--batch", str(batch), "--json")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert json.loads(proc.stdout)["scores"] == [0.3]


HOSTILE_REWARDS = {
    "bad_utf8_in_a_literal": b"def reward(batch):\n    return ['\xff' for _ in batch]\n",
    "bad_utf8_first_line": b"\xc3\x28 = 1\ndef reward(batch):\n    return []\n",
    "nested_brackets": b"x = "
    + b"[" * 200_000
    + b"]" * 200_000
    + b"\ndef reward(b):\n    return []\n",
    "nested_unary": b"x = " + b"-" * 200_000 + b"1\ndef reward(b):\n    return []\n",
    "null_byte": b"def reward(batch):\n    return [0.0\x00 for _ in batch]\n",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_REWARDS))
def test_check_classifies_hostile_reward_files_instead_of_crashing(
    tmp_path: Path, case: str
) -> None:
    """``check`` reads no batch: its input is the reward file, and a hostile one (bad
    UTF-8, nested too deeply for the parser, a null byte) is classified and refused —
    a failed check (exit 1) whose reason is on stderr — never a traceback."""
    reward = tmp_path / "reward.py"
    reward.write_bytes(HOSTILE_REWARDS[case])
    proc = _cli("check", str(reward))
    err = proc.stderr.decode("utf-8")
    assert "Traceback" not in err and "a bug in runwatch" not in err, err[-2000:]
    assert proc.returncode == 1 and b"FAILED" in proc.stdout
    assert "not a reward artifact: does not parse" in err
    doc = json.loads(_cli("check", str(reward), "--json").stdout)
    assert doc["kind"] == "invalid" and doc["passed"] is False


def test_score_with_a_file_that_is_not_a_reward_books_the_tenant(tmp_path: Path) -> None:
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"prompt": "a", "completion": "b"}\n')
    reward = tmp_path / "reward.py"
    reward.write_text("reward = lambda batch: [1.0 for _ in batch]\n")
    proc = _cli("score", str(reward), "--batch", str(batch), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["status"] == "refused"
    assert doc["ledger"]["cause"] == "tenant_bad_artifact"
    assert "bound by an assignment" in doc["ledger"]["message"]


def test_check_reports_the_isolation_layers_including_pid1_proc_and_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_sandbox()
    rc = main(["sandbox", "check", str(write_reward(tmp_path, GOOD)), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    assert {"own_pid1", "proc_masked", "cgroup_cpu", "seccomp"} <= set(doc["layers"]["applied"])
    assert doc["layers"]["missing"] == []
