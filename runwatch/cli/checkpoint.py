"""``runwatch checkpoint inspect PATH [--json]``: what a checkpoint holds, verified.

Reads the metadata, verifies schema, the metadata digest, the data size and every part's
sentinel digest, and prints parts, pins and the verdict (exit 1 if it would not load).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runwatch.cli.terminal import Abort, Terminal

HELP = "inspect a checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    ins = sub.add_parser("inspect", help="show and verify one checkpoint (or a run's newest)")
    ins.add_argument("path", help="a checkpoint directory, or a checkpoints/ or run directory")
    ins.add_argument("--json", action="store_true", help="one JSON object")


def _resolve(path: Path) -> Path:
    from trainer import checkpoint as ckpt

    if (path / ckpt.META).exists() or (path / ckpt.DATA).exists():
        return path
    for root in (path, path / "checkpoints"):
        found = ckpt.list_checkpoints(root)
        if found:
            return found[0]
    raise Abort(f"{path} is not a checkpoint (no {ckpt.META}) and holds none")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from trainer import checkpoint as ckpt

    path = Path(args.path)
    if not path.exists():
        raise Abort(f"{path} does not exist")
    path = _resolve(path)
    verdict, detail, info = "ok", "", None
    try:
        info, _parts = ckpt.read_checkpoint(path)
    except ckpt.CheckpointError as exc:
        verdict, detail = exc.reason, str(exc)
        try:
            info = ckpt.read_metadata(path)
        except ckpt.CheckpointError:
            info = None
    out: dict = {"path": str(path), "verdict": verdict, "detail": detail}
    if info is not None:
        out.update(
            schema=info.schema,
            step=info.step,
            run_id=info.run_id,
            tenant_id=info.tenant_id,  # None: an earlier release's checkpoint
            submitted_id=info.submitted_id,
            size_bytes=info.size_bytes,
            digest=info.digest,
            pins=info.pins,
            parts={k: {"size": v["size"], "digest": v["digest"]} for k, v in info.parts.items()},
            extra=info.extra,
        )
    if args.json:
        term.json(out)
    else:
        term.info(f"checkpoint {path}: {verdict}" + (f" ({detail})" if detail else ""))
        if info is not None:
            term.info(
                f"run {info.run_id}  tenant {info.tenant_id or '(not recorded)'}  "
                f"step {info.step}  schema {info.schema}  "
                f"{info.size_bytes} bytes"
            )
            term.table([(k, v) for k, v in sorted(info.pins.items())], ["pin", "value"])
            term.table(
                [(k, v["size"], v["digest"]) for k, v in info.parts.items()],
                ["part", "bytes", "digest"],
            )
    return 0 if verdict == "ok" else 1
