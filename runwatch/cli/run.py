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
from runwatch.cli.terminal import Abort, Terminal

HELP = "pause, resume or cancel a run (commands are events on runwatch.control)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("pause", "resume", "cancel"))
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("--reason", default="", help="why (recorded on the command)")
    parser.add_argument("--log", metavar="DIR", help="embedded log (default: $RUNWATCH_LOG_DIR)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait for the answer")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from events.catalog.control import CommandRejected
    from events.envelope import EventBase
    from events.log.embedded import EmbeddedLog
    from producers.commands import ACTIONS, refusal, run_phase
    from producers.emitter import Emitter
    from producers.sinks import EmbeddedSink

    log_dir = settings.log_dir(args.log)
    if not log_dir.is_dir():
        raise Abort(f"no embedded log at {log_dir}", code=2)
    reader = EmbeddedLog(log_dir, readonly=True)  # reads never write (nor repair)
    reader.open_sync()
    topics = [t for t in ("runwatch.lifecycle",) if t in reader.topic_names()]
    facts = [e for e in reader.iter_events(topics) if isinstance(e, EventBase)]
    facts = [e for e in facts if e.run_id == args.run_id]
    # appends go to the control topic only: its writers serialise on the topic's flock
    log = EmbeddedLog(log_dir)
    tenant = facts[0].tenant_id if facts else ""
    principal = getpass.getuser()
    emitter = Emitter(
        EmbeddedSink(log),
        tenant_id=tenant,
        run_id=args.run_id,
        producer=f"cli/{principal}",
        first_seq=time.time_ns(),
    )
    cls = ACTIONS[args.action]
    command = emitter.emit(cls, actor="operator", principal=principal, reason=args.reason)
    why = refusal(args.action, run_phase(facts))
    if why:
        emitter._pending.clear()
        emitter.emit(
            CommandRejected,
            command_id=str(command.event_id),
            command=cls.__name__,
            reason=why,
        )
        emitter.flush()
        raise Abort(f"cannot {args.action} {args.run_id}: {why}", code=2)
    emitter.flush()
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
        term.info(f"{args.run_id}: {cls.__name__} recorded ({command.event_id})")
    return 0


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
