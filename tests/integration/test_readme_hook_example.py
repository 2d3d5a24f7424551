"""The README's five-line hook example, run as written (bash, a background processor, a
Python one-liner) until its live alert prints.

The block between ``<!-- hooks-example -->`` markers is executed verbatim, except its
``pip install`` line (the environment is installed already; the test checks that the
extra it names exists) and with ``runwatch`` bound to this checkout's CLI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def _example() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- hooks-example -->\s*```bash\n(.*?)```", text, re.S)
    assert block, "README lost its hooks example"
    return block.group(1).rstrip("\n").split("\n")


def test_readme_example_is_five_lines_from_install_to_alert() -> None:
    lines = _example()
    assert len(lines) <= 5
    extra = re.fullmatch(r"pip install -e '\.\[(\w+)\]'", lines[0])
    assert extra, lines[0]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extra.group(1) in extras and any("trl" in d for d in extras[extra.group(1)])


def test_readme_example_prints_a_live_alert(tmp_path: Path) -> None:
    lines = _example()[1:]
    out = tmp_path / "out.txt"
    script = "\n".join(
        [
            f'runwatch() {{ exec "{sys.executable}" -m runwatch.cli.main "$@"; }}',
            *lines,
            'for i in $(seq 1 1200); do grep -q "^ALERT" out.txt && break; sleep 0.25; done',
            "kill %1; wait",
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RUNWATCH_LOG_DIR", None)
    env.pop("RUNWATCH_KAFKA", None)
    t0 = time.monotonic()
    with open(out, "w") as f:
        proc = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=360,
        )
    took = time.monotonic() - t0
    text = out.read_text()
    alert = [line for line in text.splitlines() if line.startswith("ALERT")]
    assert alert, f"no alert printed:\n{text}\n{proc.stderr[-3000:]}"
    assert re.match(r"ALERT\s+page\s+kl_blowup run my-run step \d+:", alert[0]), alert[0]
    print(f"\nREADME example: '{alert[0][:80]}...' after {took:.1f} s")
