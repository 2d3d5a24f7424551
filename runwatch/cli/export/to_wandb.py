"""``runwatch export wandb RUN``: the run as a W&B run (the ``wandb`` client library).

What is written (one new W&B run named after the runwatch run, in ``--project``):

- history: one ``log(metrics, step=N)`` per step, in step order
  (:mod:`runwatch.cli.export.history` names);
- alerts: one W&B alert per runwatch alert (``run.alert``: title
  ``<detector> (<routing>)``, the reason as text, level ERROR for ``page``, WARN for
  ``ticket``, INFO for ``advisory``), and a ``runwatch/alerts`` table;
- state changes: a ``runwatch/state_changes`` table; the summary's ``runwatch/state``
  and ``runwatch/failure_class`` hold the final state;
- checkpoints: a ``runwatch/checkpoints`` table, and one ``checkpoint`` artifact per
  checkpoint holding ``runwatch-checkpoint.json`` (the CheckpointWritten record) and
  *referencing* its path when it still exists here (``file://``; nothing uploaded), with
  step, digest and sentinels as metadata and the alias ``step-<N>``;
- config: the submitted config, algorithm, run and tenant ids.

``--offline`` (or ``WANDB_MODE=offline``) writes the run under ``--dir`` for a later
``wandb sync``; online needs ``wandb login``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from runwatch.cli.export.source import load
from runwatch.cli.terminal import Abort, Terminal

HELP = "write a run's history to W&B (metrics, alerts, state changes, checkpoints)"
LEVELS = {"page": "ERROR", "ticket": "WARN", "advisory": "INFO"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", default="runwatch", help="W&B project")
    parser.add_argument("--entity", help="W&B entity (default: yours)")
    parser.add_argument("--dir", help="where W&B writes its files (default: W&B's)")
    parser.add_argument("--offline", action="store_true", help="offline mode (wandb sync later)")
    parser.add_argument(
        "--checkpoint-root",
        metavar="DIR",
        help="reference checkpoints under DIR in their artifacts (default: none; a "
        "checkpoint's path comes from its event, which the run's producer wrote)",
    )


def run(args: argparse.Namespace, term: Terminal) -> int:
    history = load(args)
    try:
        import wandb
    except ImportError:
        raise Abort("wandb is not installed: pip install 'runwatch[hooks]'") from None
    if args.dir:
        try:
            os.makedirs(args.dir, exist_ok=True)
        except OSError as exc:
            raise Abort(f"--dir {args.dir}: {exc.strerror or exc}") from None
    wb = wandb.init(
        project=args.project,
        entity=args.entity,
        name=history.run_id,
        dir=args.dir,
        mode="offline" if args.offline else None,
        config={
            "runwatch_run_id": history.run_id,
            "tenant_id": history.tenant_id,
            "algorithm": history.algorithm,
            **{f"submitted/{k}": v for k, v in history.config.items()},
        },
        tags=["runwatch", history.algorithm or "unknown"],
        reinit="create_new",
    )
    try:
        points = 0
        for step, _ts, row in history.rows():
            wb.log(dict(row), step=step)
            points += len(row)
        last = max(history.steps, default=0)
        for alert in history.alerts:
            wb.alert(
                title=f"{alert['detector']} ({alert['routing']})",
                text=_alert_text(alert),
                level=getattr(wandb.AlertLevel, LEVELS.get(alert["routing"], "INFO")),
            )
        tables = {
            "runwatch/alerts": _table(
                wandb,
                history.alerts,
                (
                    "alert_id",
                    "detector",
                    "routing",
                    "step",
                    "window",
                    "reason",
                    "resolved_at_step",
                    "resolved_reason",
                ),
            ),
            "runwatch/state_changes": _table(
                wandb,
                history.states,
                ("step", "from_state", "to_state", "reason", "failure_class", "ts"),
            ),
            "runwatch/checkpoints": _table(
                wandb,
                history.checkpoints,
                ("step", "path", "digest", "size_bytes", "checkpoint_schema"),
            ),
        }
        wb.log(tables, step=last)
        for ck in history.checkpoints:
            art = wandb.Artifact(
                f"{_artifact_name(history.run_id)}-checkpoint",
                type="checkpoint",
                metadata={
                    k: ck[k]
                    for k in (
                        "step",
                        "digest",
                        "size_bytes",
                        "sentinels",
                        "checkpoint_schema",
                        "path",
                    )
                },
            )
            with art.new_file("runwatch-checkpoint.json") as f:
                json.dump(ck, f, indent=2, default=str)
            ref = _checkpoint_file(ck["path"], args.checkpoint_root)
            if ref is not None:  # else metadata only (rotated away, elsewhere, not allowed)
                art.add_reference(f"file://{ref}", checksum=False)
            wb.log_artifact(art, aliases=[f"step-{ck['step']}"])
        wb.summary["runwatch/state"] = history.final_state
        if history.states and history.states[-1]["failure_class"]:
            wb.summary["runwatch/failure_class"] = history.states[-1]["failure_class"]
        wb.summary["runwatch/alerts"] = len(history.alerts)
        wandb_id, wandb_dir = wb.id, wb.dir
    finally:
        wb.finish(exit_code=1 if history.final_state == "FAILED" else 0)
    summary = {
        **history.summary(),
        "target": "wandb",
        "wandb_run_id": wandb_id,
        "wandb_dir": os.path.dirname(wandb_dir),
        "offline": bool(args.offline),
        "metric_points": points,
    }
    if args.json:
        term.json(summary)
    else:
        term.info(
            f"exported run {history.run_id} to W&B run {wandb_id}"
            f"{' (offline: wandb sync ' + summary['wandb_dir'] + ')' if args.offline else ''}: "
            f"{len(history.steps)} steps, {points} metric points, {len(history.alerts)} "
            f"alerts, {len(history.states)} state changes, {len(history.checkpoints)} "
            "checkpoints"
        )
    return 0


def _checkpoint_file(path: Any, root: str | None) -> str | None:
    """The checkpoint to reference: ``path`` resolved, if it is a file or a directory (a
    trainer's ``step-N/``, transformers' ``checkpoint-N``, verl's ``global_step_N``) under
    ``root``; else None. The path is a producer's (a customer's hook writes
    ``CheckpointWritten``): referencing it as given listed and sized whatever it named on
    the exporting host (``/etc``, a home directory) in the artifact's manifest."""
    if root is None or not isinstance(path, str):
        return None
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    if real == base or os.path.commonpath([base, real]) != base or not os.path.exists(real):
        return None
    return real


def _table(wandb: Any, records: list[dict[str, Any]], columns: tuple[str, ...]) -> Any:
    return wandb.Table(
        columns=list(columns),
        data=[[_cell(r.get(c)) for c in columns] for r in records],
    )


def _cell(value: Any) -> Any:
    if isinstance(value, list | tuple | dict):
        return str(value)
    return value


def _alert_text(alert: dict[str, Any]) -> str:
    text = (
        f"step {alert['step']} (window {alert['window'][0]}-{alert['window'][1]}): "
        f"{alert['reason']}\nfirst response: {alert['first_response']}"
    )
    if alert["resolved_at_step"] is not None:
        text += f"\nresolved at step {alert['resolved_at_step']}: {alert['resolved_reason']}"
    return text


def _artifact_name(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in run_id)
