"""``runwatch run pause|resume|cancel RUN [--reason TEXT] [--log DIR]``: command a run.

Appends a ``PauseRequested`` / ``UnpauseRequested`` / ``CancelRequested`` (actor
``operator``, principal ``$USER``) to the run's control topic on the embedded log; the
run's trainer answers at its next step boundary (``RunPaused`` / ``RunResumed`` /
``RunCancelled``). A command that cannot apply — an unknown run, a run that has ended, a
resume of a run that is not paused — is refused with exit code 2, and a
``CommandRejected`` naming it is recorded on the control topic (no state changes).
``--wait S`` waits up to S seconds for the trainer's answer and prints it.
"""

from __future__ import annotations

import argparse
import getpass
import time

from runwatch import settings
from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal

HELP = "pause, resume or cancel a run (commands are events on runwatch.control)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("pause", "resume", "cancel"))
    parser.add_argument("run_id", metavar="RUN", type=identifier)
    parser.add_argument("--reason", default="", help="why (recorded on the command)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="resume only: a setting to change before continuing (lr=0.001)",
    )
    parser.add_argument("--log", metavar="DIR", help="embedded log (default: $RUNWATCH_LOG_DIR)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait for the answer")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from events.log.embedded import EmbeddedLog
    from producers.commands import issue

    log_dir = settings.log_dir(args.log)
    if not log_dir.is_dir():
        raise Abort(f"no embedded log at {log_dir}", code=2)
    overrides = _parse_sets(args.set)
    issued = issue(
        log_dir,
        args.run_id,
        args.action,
        actor="operator",
        principal=getpass.getuser(),
        reason=args.reason,
        overrides=overrides,
    )
    if issued.refused:
        raise Abort(f"cannot {args.action} {args.run_id}: {issued.refused}", code=2)
    command = issued.command
    reader = EmbeddedLog(log_dir, readonly=True)
    reader.open_sync()
    answer = _wait_for_answer(reader, args.run_id, str(command.event_id), args.wait)
    result = {
        "run_id": args.run_id,
        "action": args.action,
        "command_id": str(command.event_id),
        "answered": answer.type if answer else None,
        "step": answer.step if answer else None,
    }
    if args.json:
        term.json(result)
    elif answer is not None:
        term.info(f"{args.run_id}: {answer.type} at step {answer.step}")
    else:
        term.info(f"{args.run_id}: {command.type} recorded ({command.event_id})")
    return 0


def _parse_sets(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise Abort(f"--set takes KEY=VALUE, not {item!r}", code=2)
        try:
            out[key] = float(raw) if any(c in raw for c in ".eE") else int(raw)
        except ValueError:
            out[key] = raw
    return out


def _wait_for_answer(log, run_id: str, request_id: str, wait_s: float):  # type: ignore[no-untyped-def]
    from events.catalog.lifecycle import RunCancelled, RunPaused, RunResumed
    from events.codec import decode

    end = time.monotonic() + wait_s
    offset = 0
    while wait_s > 0:
        for rec in log.read_sync("runwatch.lifecycle", offset):
            offset = rec.offset + 1
            ev = decode(rec.value)
            if (
                isinstance(ev, RunPaused | RunResumed | RunCancelled)
                and ev.run_id == run_id
                and ev.request_id == request_id
            ):
                return ev
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)
    return None
