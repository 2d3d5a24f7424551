"""A command's output directory, emptied for each run but never someone else's files."""

from __future__ import annotations

import shutil
from pathlib import Path

from runwatch.cli.terminal import Abort


def fresh_out_dir(out: Path, kind: str) -> Path:
    """Make ``out`` an empty directory for a ``runwatch <kind>`` run. A directory a
    previous run made (it holds ``.runwatch-<kind>``) or an empty one is replaced; any
    other existing directory is refused, so a mistyped ``--out`` deletes nothing."""
    marker = out / f".runwatch-{kind}"
    if out.exists() and not out.is_dir():
        raise Abort(f"{out} is a file, not a directory; pick another --out")
    if out.exists():
        if not marker.exists() and any(out.iterdir()):
            raise Abort(f"{out} exists and is not a runwatch {kind} directory; pick another --out")
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True)
        marker.touch()
    except OSError as exc:
        raise Abort(f"cannot make {out}: {exc.strerror or exc}") from None
    return out
