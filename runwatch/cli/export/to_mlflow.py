"""``runwatch export mlflow RUN``: the run as an MLflow run (``mlflow`` / ``mlflow-skinny``).

What is written (one new MLflow run named after the runwatch run, in ``--experiment``):

- metrics: every step's history (:mod:`runwatch.cli.export.history` names), each point
  at its step with the event's time, in ``log_batch`` calls of 1,000;
- params: the run's submitted config (``RunSubmitted.config``) and algorithm;
- tags: ``runwatch.run_id`` / ``.tenant_id`` / ``.algorithm``; ``runwatch.state`` (the
  final customer state) and ``runwatch.failure_class``; one
  ``runwatch.alert.<detector>.<n>`` per alert (routing, steps, reason; "resolved at step
  N" once resolved) and ``runwatch.alerts`` (how many);
  ``runwatch.checkpoint.<step>`` (path and digest) per checkpoint;
- artifacts under ``runwatch/``: ``alerts.json``, ``state_changes.json``,
  ``checkpoints.json``, ``lifecycle.json`` (the full records).

``--tracking-uri`` is MLflow's (``file:./mlruns``, ``sqlite:///mlflow.db``, a server);
default ``$MLFLOW_TRACKING_URI`` or MLflow's own default. MLflow 3 refuses new file
stores unless ``MLFLOW_ALLOW_FILE_STORE=true``; that choice is left to the user.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from runwatch.cli.export.history import RunHistory
from runwatch.cli.export.source import load
from runwatch.cli.terminal import Abort, Terminal

HELP = "write a run's history to MLflow (metrics, alert tags, state changes, checkpoints)"
BATCH = 1000
_KEY = re.compile(r"[^/\w.\- :]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's)")
    parser.add_argument("--experiment", default="runwatch", help="experiment name (created)")


def key(name: str) -> str:
    """An MLflow-legal metric / param / tag key (verl's own sanitising: ``@`` -> ``_at_``;
    MLflow refuses a key that is not a normalized relative path, so empty, ``.`` and ``..``
    parts, and the leading dots of a first part starting ``..``, become underscores: a
    customer's metric named ``../../m`` failed the whole export, leaving the run RUNNING)."""
    legal = _KEY.sub("_", name.replace("@", "_at_"))
    parts = ["_" if p in ("", ".") else "__" if p == ".." else p for p in legal.split("/")]
    first = parts[0]
    if first.startswith(".."):  # the key would normalize to a path starting with ".."
        dots = len(first) - len(first.lstrip("."))
        parts[0] = "_" * dots + first[dots:]
    return "/".join(parts)


def run(args: argparse.Namespace, term: Terminal) -> int:
    history = load(args)
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise Abort("MLflow is not installed: pip install 'runwatch[hooks]'") from None
    try:  # the tracking store (a URI MLflow refuses, a server that is down): say why
        client = MlflowClient(tracking_uri=args.tracking_uri)
        experiment = client.get_experiment_by_name(args.experiment)
        experiment_id = (
            experiment.experiment_id if experiment else client.create_experiment(args.experiment)
        )
        mlrun = client.create_run(experiment_id, run_name=history.run_id, tags=_tags(history))
    except Exception as exc:  # MlflowException and the store's own; nothing was written
        where = args.tracking_uri or "MLflow's default tracking URI"
        raise Abort(f"MLflow refused {where}: {str(exc)[:500]}") from None
    run_id = mlrun.info.run_id
    try:
        metrics = _write(client, run_id, history)
    except Exception as exc:  # MlflowException and the store's own: end the run, say why
        client.set_terminated(run_id, status="FAILED")
        raise Abort(f"MLflow refused the export of run {history.run_id}: {exc}") from None
    summary = {
        **history.summary(),
        "target": "mlflow",
        "tracking_uri": client.tracking_uri,
        "experiment_id": experiment_id,
        "mlflow_run_id": run_id,
        "metric_points": len(metrics),
    }
    if args.json:
        term.json(summary)
    else:
        term.info(
            f"exported run {history.run_id} to MLflow run {run_id} ({client.tracking_uri}): "
            f"{len(history.steps)} steps, {len(metrics)} metric points, "
            f"{len(history.alerts)} alerts, {len(history.states)} state changes, "
            f"{len(history.checkpoints)} checkpoints"
        )
    return 0


def _write(client: Any, run_id: str, history: RunHistory) -> list[Any]:
    """Log the history into the MLflow run and end it; the metrics written."""
    from mlflow.entities import Metric, Param, RunTag

    metrics = [
        Metric(key(name), value, int(ts * 1000), step)
        for step, ts, row in history.rows()
        for name, value in sorted(row.items())
    ]
    for i in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + BATCH])
    params = [Param(key(k), str(v)[:6000]) for k, v in sorted(history.config.items())]
    params.append(Param("algorithm", history.algorithm or "unknown"))
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i : i + 100])
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in _state_tags(history).items()])
    for name, records in (
        ("alerts", history.alerts),
        ("state_changes", history.states),
        ("checkpoints", history.checkpoints),
        ("lifecycle", history.lifecycle),
    ):
        client.log_dict(run_id, records, f"runwatch/{name}.json")
    final = "FAILED" if history.final_state == "FAILED" else "FINISHED"
    client.set_terminated(run_id, status=final)
    return metrics


def _tags(history: RunHistory) -> dict[str, str]:
    return {
        "runwatch.run_id": history.run_id,
        "runwatch.tenant_id": history.tenant_id,
        "runwatch.algorithm": history.algorithm or "unknown",
    }


def _state_tags(history: RunHistory) -> dict[str, str]:
    tags: dict[str, str] = {"runwatch.alerts": str(len(history.alerts))}
    if history.states:
        last = history.states[-1]
        tags["runwatch.state"] = last["to_state"]
        tags["runwatch.state_reason"] = last["reason"][:5000]
        if last["failure_class"]:
            tags["runwatch.failure_class"] = last["failure_class"]
    counts: dict[str, int] = {}
    for alert in history.alerts:
        n = counts[alert["detector"]] = counts.get(alert["detector"], 0) + 1
        tags[key(f"runwatch.alert.{alert['detector']}.{n}")] = _alert_text(alert)
    for ck in history.checkpoints:
        tags[f"runwatch.checkpoint.{ck['step']}"] = f"{ck['path']} {ck['digest']}"
    return tags


def _alert_text(alert: dict[str, Any]) -> str:
    resolved = (
        f"; resolved at step {alert['resolved_at_step']}"
        if alert["resolved_at_step"] is not None
        else ""
    )
    text = (
        f"[{alert['routing']}] fired at step {alert['step']} (window {alert['window'][0]}-"
        f"{alert['window'][1]}): {alert['reason']}{resolved}"
    )
    return text[:5000]
