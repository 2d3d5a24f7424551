"""``runwatch sandbox``: run a tenant reward artifact in the untrusted reward sandbox.

- ``runwatch sandbox check REWARD.py [--tier T] [--json]``: classify the artifact (never
  importing it here), check this host can run its tier, then score a built-in sample batch
  twice in the sandbox (gate, ledger cause, determinism). Exit 0 only if it passes.
- ``runwatch sandbox score REWARD.py --batch FILE.jsonl [--tier T] [--deadline S] [--json]``:
  score one batch (one JSON object per line, each with ``prompt`` and ``completion``) and
  print the scores and the ledger entry (cause, duration, message). Exit 1 unless ok;
  exit 2, with the file, line and reason on stderr and nothing run, when the batch file
  is unusable: unreadable, not UTF-8, a line that is not one JSON object or is nested too
  deeply, or a batch the sandbox could not send (:mod:`sandbox.batch`: NaN, lone
  surrogates, too large).
- ``runwatch sandbox features [--json]``: which isolation layers this kernel allows.

A reward file defines ``reward(batch: list[dict]) -> list[float]``; it runs inside the
sandbox with the Python standard library only.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal
from sandbox.batch import MAX_BATCH_BYTES, validate_batch

HELP = "check or score a tenant reward function in the sandbox"

SAMPLE_BATCH: list[dict[str, Any]] = [
    {"prompt": "What is 2 + 2?", "completion": "4"},
    {"prompt": "What is 2 + 2?", "completion": "The answer is 5."},
    {"prompt": "Name a prime number.", "completion": "7"},
    {"prompt": "Write a haiku.", "completion": "old pond / a frog jumps in / sound of water"},
    {"prompt": "Say nothing.", "completion": ""},
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", metavar="SUBCOMMAND", required=True)
    chk = sub.add_parser("check", help="validate a reward artifact on sample data")
    chk.add_argument("artifact", help="reward file defining reward(batch) -> list[float]")
    _common(chk)
    sc = sub.add_parser("score", help="score one batch and print scores + ledger entry")
    sc.add_argument("artifact", help="reward file defining reward(batch) -> list[float]")
    sc.add_argument("--batch", required=True, help="JSONL file: one {prompt, completion} a line")
    _common(sc)
    feat = sub.add_parser("features", help="which isolation layers this kernel allows")
    feat.add_argument("--json", action="store_true", help="print as JSON")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", choices=["function", "verifier"], help="default: classified")
    p.add_argument("--deadline", type=float, default=10.0, help="seconds per batch (10)")
    p.add_argument(
        "--tenant", type=identifier, default="cli", help="tenant id for the ledger (cli)"
    )
    p.add_argument("--json", action="store_true", help="print as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    if args.sandbox_command == "features":
        return _features(args, term)
    path = Path(args.artifact)
    if not path.is_file():
        raise Abort(f"no such reward file: {path}")
    if args.sandbox_command == "check":
        return _check(args, path, term)
    return _score(args, path, term)


def _features(args: argparse.Namespace, term: Terminal) -> int:
    from sandbox.features import probe, tier_gate

    f = probe()
    if args.json:
        term.json(
            {
                "usable": f.usable,
                "why": f.why,
                "tiers": {t: tier_gate(f, t).allowed for t in ("function", "verifier")},
            }
        )
    else:
        term.info(f.describe())
    return 0


def _layers(tier: str) -> dict[str, list[str]]:
    """The isolation layers a sandbox of ``tier`` gets on this host, and the missing ones."""
    from sandbox.features import probe, tier_gate
    from sandbox.types import ALL_LAYERS

    gate = tier_gate(probe(), tier)
    return {
        "applied": [layer for layer in ALL_LAYERS if layer not in gate.missing],
        "missing": list(gate.missing),
    }


def _client(args: argparse.Namespace, path: Path) -> Any:
    from sandbox.client import FailurePolicy, RewardClient
    from sandbox.types import ResourceLimits, SandboxConfig

    if args.deadline <= 0:
        raise Abort("--deadline must be positive")
    config = SandboxConfig(limits=replace(ResourceLimits(), deadline_s=args.deadline))
    return RewardClient(
        path,
        args.tenant,
        run_id="cli",
        tier=args.tier,
        policy=FailurePolicy("skip"),
        config=config,
        prewarm=False,
    )


#: Exit code for an unusable batch file (nothing was run).
BAD_INPUT = 2
#: Largest batch file read (JSON escapes and whitespace around a batch that encodes to at
#: most ``sandbox.batch.MAX_BATCH_BYTES``).
MAX_BATCH_FILE_BYTES = 4 * MAX_BATCH_BYTES


def read_batch(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL batch; any bad line aborts (exit 2) with its line number and the
    reason, nothing is dropped and nothing is run. Whatever the file holds, the error is a
    message, never a traceback."""

    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BATCH_FILE_BYTES + 1)  # bounded: /dev/zero is a "file" too
    except OSError as exc:
        raise Abort(f"cannot read batch file {path}: {exc}", BAD_INPUT) from None
    if len(data) > MAX_BATCH_FILE_BYTES:
        raise Abort(
            f"{path}: larger than {MAX_BATCH_FILE_BYTES} bytes (a batch encodes to at most "
            f"{MAX_BATCH_BYTES})",
            BAD_INPUT,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        no = data.count(b"\n", 0, exc.start) + 1
        raise Abort(
            f"{path}:{no}: not UTF-8 text ({exc.reason} at byte {exc.start})", BAD_INPUT
        ) from None
    batch: list[dict[str, Any]] = []
    # lines end at "\n" only: str.splitlines() would also cut inside a JSON string that
    # holds a raw U+2028, U+0085 or \x1c (valid JSON text)
    for no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except RecursionError:
            raise Abort(f"{path}:{no}: JSON nested too deeply", BAD_INPUT) from None
        except ValueError as exc:
            raise Abort(f"{path}:{no}: not JSON: {exc}", BAD_INPUT) from None
        if not isinstance(obj, dict):
            raise Abort(f"{path}:{no}: expected an object, got {type(obj).__name__}", BAD_INPUT)
        for key in ("prompt", "completion"):
            if not isinstance(obj.get(key), str):
                raise Abort(f"{path}:{no}: missing string field {key!r}", BAD_INPUT)
        bad = validate_batch([obj])
        if bad:
            raise Abort(f"{path}:{no}: {bad.replace('batch[0]', 'line', 1)}", BAD_INPUT)
        batch.append(obj)
    if not batch:
        raise Abort(f"{path}: empty batch", BAD_INPUT)
    bad = validate_batch(batch)
    if bad:
        raise Abort(f"{path}: {bad}", BAD_INPUT)
    return batch


def _entry(outcome: Any) -> dict[str, Any]:
    return {
        "status": outcome.status.value,
        "tier": outcome.tier,
        "n": outcome.n,
        "scores": list(outcome.scores) if outcome.scores is not None else None,
        "ledger": {
            "cause": outcome.cause.value,
            "duration_s": round(outcome.duration_s, 6),
            "message": outcome.message,
        },
        "missing_layers": list(outcome.missing_layers),
    }


def _score(args: argparse.Namespace, path: Path, term: Terminal) -> int:
    batch = read_batch(Path(args.batch))
    with _client(args, path) as client:
        outcome = client.score(batch)
    entry = _entry(outcome)
    if args.json:
        term.json(entry)
    else:
        if outcome.scores is not None:
            term.table(
                [(i, b["prompt"][:40], s) for i, (b, s) in enumerate(zip(batch, outcome.scores))],
                ["#", "prompt", "score"],
            )
        term.table(
            [
                (
                    entry["status"],
                    entry["ledger"]["cause"],
                    f"{outcome.duration_s * 1000:.1f} ms",
                    outcome.message.splitlines()[-1] if outcome.message else "",
                )
            ],
            ["status", "cause", "duration", "message"],
        )
        if outcome.missing_layers:
            term.warn(f"ran without isolation layers: {', '.join(outcome.missing_layers)}")
    return 0 if outcome.ok else 1


def _check(args: argparse.Namespace, path: Path, term: Terminal) -> int:
    from sandbox.classify import classify_path

    cls = classify_path(path)
    findings: list[str] = []
    result: dict[str, Any] = {
        "artifact": str(path),
        "kind": cls.kind.value,
        "tier": args.tier or cls.tier,
        "digest": cls.digest,
        "reasons": list(cls.reasons),
    }
    tier = args.tier or cls.tier
    if tier is not None:
        result["layers"] = _layers(tier)
    if cls.tier is None:
        findings.append("not a reward artifact: " + "; ".join(cls.reasons))
    else:
        with _client(args, path) as client:
            first = client.score(SAMPLE_BATCH)
            result["sample"] = _entry(first)
            if client.refused:
                findings.append(client.refused)
            elif not first.ok:
                findings.append(f"sample batch failed: {first.cause.value}: {first.message}")
            else:
                second = client.score(SAMPLE_BATCH)
                if second.ok and second.scores != first.scores:
                    findings.append("non-deterministic: the same batch scored differently")
                elif not second.ok:
                    findings.append(f"second run failed: {second.cause.value}")
                if first.scores is not None and len(set(first.scores)) == 1:
                    findings.append("constant scores on a varied sample (dead gradient signal)")
    result["findings"] = findings
    result["passed"] = not findings
    if args.json:
        term.json(result)
    else:
        term.table(
            [
                ("kind", result["kind"]),
                ("tier", result["tier"]),
                ("digest", cls.digest[:23]),
                ("why", "; ".join(cls.reasons)),
            ]
            + (
                [
                    (
                        "sample",
                        f"{result['sample']['status']} / {result['sample']['ledger']['cause']}"
                        f" / {result['sample']['ledger']['duration_s'] * 1000:.1f} ms",
                    )
                ]
                if "sample" in result
                else []
            )
            + (
                [
                    ("layers", ", ".join(result["layers"]["applied"])),
                    ("missing", ", ".join(result["layers"]["missing"]) or "none"),
                ]
                if "layers" in result
                else []
            ),
            ["field", "value"],
        )
        for f in findings:
            term.warn(f)
        term.info("PASSED" if not findings else "FAILED")
    return 0 if not findings else 1
