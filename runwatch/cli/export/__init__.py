"""``runwatch export wandb|mlflow RUN``: a run's history, into the tools people look at.

One module per target (:mod:`runwatch.cli.export.to_wandb`,
:mod:`runwatch.cli.export.to_mlflow`), each imported only when used; both read the run
from an embedded log (``--log DIR``, default ``$RUNWATCH_LOG_DIR``) or Kafka
(``--kafka BOOTSTRAP``) through :mod:`runwatch.cli.export.history` and write its metrics
history (per step), alerts, state changes and checkpoints. ``--json`` prints what was
written. Each export creates a new W&B / MLflow run tagged with the runwatch run id.
"""

from __future__ import annotations

import argparse
import importlib

from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Terminal

HELP = "write a run's metrics history, alerts, state changes and checkpoints to W&B or MLflow"
TARGETS = {"wandb": "runwatch.cli.export.to_wandb", "mlflow": "runwatch.cli.export.to_mlflow"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="export_target", metavar="TARGET", required=True)
    for name, module in TARGETS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        p.add_argument("run_id", metavar="RUN", type=identifier, help="the runwatch run id")
        source = p.add_mutually_exclusive_group()
        source.add_argument("--log", help="embedded log directory (default: $RUNWATCH_LOG_DIR)")
        source.add_argument("--kafka", metavar="BOOTSTRAP", help="read the run from Kafka")
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        mod.add_arguments(p)


def run(args: argparse.Namespace, term: Terminal) -> int:
    return int(importlib.import_module(TARGETS[args.export_target]).run(args, term) or 0)
