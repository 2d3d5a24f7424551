"""``runwatch train --config FILE [--log DIR]``: run the GRPO trainer, publishing to the log.

Checkpoints and the config snapshot go to the config's ``run_dir`` when it names one, else
to ``--runs DIR/<run_id>``, else (the default) to ``runs/<run_id>-<8 hex of the log's
path>`` next to the log directory: two logs side by side (two experiments, two tenants)
that reuse a run id get two run directories, not one shared. The resume reads the run
directory from the run's ``RunSubmitted``, so it follows whichever was chosen. Progress
lines go to stderr; the final summary to stdout (``--json`` for one JSON object).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from runwatch import settings
from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal

HELP = "run the GRPO trainer from a config file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="trainer config (YAML or JSON)")
    parser.add_argument("--log", help="embedded log directory (default: $RUNWATCH_LOG_DIR)")
    parser.add_argument(
        "--runs",
        help="runs directory, the run in DIR/<run_id> (default: 'runs' beside the log, the "
        "run in runs/<run_id>-<hash of the log path>)",
    )
    parser.add_argument("--run-id", type=identifier, help="override the config's run_id")
    parser.add_argument("--steps", type=int, help="override the config's step count")
    parser.add_argument("--seed", type=int, help="override the config's seed")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def log_tag(log: Path) -> str:
    """8 hex digits of the log directory's resolved path (sha256): what tells two logs'
    default run directories apart."""
    return hashlib.sha256(str(log.resolve()).encode()).hexdigest()[:8]


def run_dir_for(cfg_run_dir: str | None, runs: str | None, log: Path, run_id: str) -> Path:
    """The run directory: the config's ``run_dir``; else ``runs/<run_id>`` (an explicit
    runs directory, the caller's to keep apart); else ``runs/<run_id>-<log tag>`` beside
    the log (unique per log: the same run id in two logs never shares checkpoints)."""
    if cfg_run_dir:
        return Path(cfg_run_dir)
    if runs:
        return Path(runs) / run_id
    return log.resolve().parent / "runs" / f"{run_id}-{log_tag(log)}"


def run(args: argparse.Namespace, term: Terminal) -> int:
    from trainer.config import load_config
    from trainer.device import DeviceUnavailable, check_device
    from trainer.engines import check_servable
    from trainer.loop import RunBusy, train
    from trainer.publish import make_emitter, run_events
    from trainer.rewards import RewardUnavailable
    from trainer.rollout import RolloutEngineFailed, RolloutUnavailable

    try:
        cfg = load_config(args.config, run_id=args.run_id, steps=args.steps, seed=args.seed)
    except ValueError as exc:
        raise Abort(str(exc)) from None
    try:  # before anything is published: a device or policy this host cannot run
        check_device(cfg.device)
        check_servable(cfg)
    except (DeviceUnavailable, RolloutUnavailable) as exc:
        raise Abort(f"run {cfg.run_id} refused at start: {exc}") from None
    if cfg.reward.kind == "sandbox" and not Path(str(cfg.reward.sandbox_path)).is_file():
        raise Abort(f"reward file {cfg.reward.sandbox_path} does not exist")
    log = settings.log_dir(args.log)
    run_dir = run_dir_for(cfg.run_dir, args.runs, log, cfg.run_id)
    if log.is_dir() and any(True for _ in run_events(log, cfg.run_id)):
        raise Abort(
            f"run {cfg.run_id!r} already has events in {log}; use `runwatch resume --run-id "
            f"{cfg.run_id}` or another --run-id"
        )
    emitter = make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log)
    say = (lambda _m: None) if args.quiet else term.progress
    try:
        trainer = train(cfg, run_dir, emitter, progress=say)
    except (RunBusy, RolloutUnavailable) as exc:
        raise Abort(str(exc)) from None
    except RewardUnavailable as exc:
        if exc.action == "pause":
            raise Abort(f"run {cfg.run_id} paused for tenant action: {exc}", code=3) from None
        raise Abort(f"run {cfg.run_id} failed ({exc.failure_class}): {exc}") from None
    except RolloutEngineFailed as exc:  # RunFailed(platform_fault) is on the log already
        raise Abort(f"run {cfg.run_id} failed ({exc.failure_class}): {exc}") from None

    score, n = trainer.evaluate()
    summary = {
        "run_id": cfg.run_id,
        "outcome": "cancelled" if trainer.cancelled else "completed",
        "steps": trainer.step,
        "eval_score": score,
        "eval_items": n,
        "run_dir": str(run_dir),
        "log": str(log),
        "pins": trainer.pins,
    }
    if args.json:
        term.json(summary)
    else:
        outcome = "was cancelled after" if trainer.cancelled else "completed"
        term.info(
            f"run {cfg.run_id} {outcome} {trainer.step} steps; held-out exact match {score:.3f} "
            f"({n} items); checkpoints in {run_dir / 'checkpoints'}"
        )
    return 0
