"""Where an export reads its run from (shared by the targets)."""

from __future__ import annotations

import argparse

from runwatch import settings
from runwatch.cli.export.history import RunHistory, read_run
from runwatch.cli.terminal import Abort


def load(args: argparse.Namespace) -> RunHistory:
    """The run's history, or an :class:`Abort` saying why there is none."""
    try:
        if args.kafka:
            history = read_run(args.run_id, kafka=args.kafka)
        else:
            history = read_run(args.run_id, log=settings.log_dir(args.log))
    except FileNotFoundError as exc:
        raise Abort(str(exc)) from None
    if history.events == 0:
        where = f"kafka {args.kafka}" if args.kafka else str(settings.log_dir(args.log))
        raise Abort(f"no events of run {args.run_id!r} in {where}")
    return history
