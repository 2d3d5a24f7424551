"""``runwatch resume --run-id R [--log DIR]``: resume a run through the resume gate.

The run's config and run directory come from its ``RunSubmitted`` event on the log. The
gate's outcome (certified or every rejection with its reason) is printed; exit 0 when the
run was certified and finished, 1 when no checkpoint passed (the run is non-resumable).
"""

from __future__ import annotations

import argparse

from runwatch import settings
from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal

HELP = "resume a run through the replay-overlap resume gate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-id", type=identifier, required=True, help="the run to resume")
    parser.add_argument("--log", help="embedded log directory (default: $RUNWATCH_LOG_DIR)")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    parser.add_argument("--json", action="store_true", help="print the gate outcome as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from trainer.loop import RunBusy
    from trainer.resume import ResumeError, describe, resume

    log = settings.log_dir(args.log)
    if not log.is_dir():
        raise Abort(f"no embedded log at {log}")
    say = (lambda _m: None) if args.quiet else term.progress
    try:
        result, trainer = resume(log, args.run_id, progress=say)
    except (ResumeError, RunBusy) as exc:
        raise Abort(str(exc)) from None
    out = describe(result)
    if trainer is not None:
        out["final_step"] = trainer.step
    if args.json:
        term.json(out)
    else:
        for r in out["rejections"]:
            term.info(f"rejected {r['checkpoint']}: {r['reason']}: {r['detail']}")
        for path in out["set_aside"]:  # rejected checkpoints of this run, kept for the audit
            term.info(f"set aside {path}")
        if result.certified:
            term.info(
                f"certified {result.checkpoint} ({result.tier}, window "
                f"{result.window[0]}..{result.window[1]}, tolerance {result.tolerance:g}, max "
                f"deviation {result.max_deviation:.3g}, replay {result.replay_s:.2f}s); run "
                f"{args.run_id} finished at step {out['final_step']}"
            )
        else:
            term.info(f"run {args.run_id} is non-resumable: no checkpoint passed the gate")
    return 0 if result.certified else 1
