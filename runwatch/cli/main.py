"""``runwatch``: the command line. One module per command, imported only when used.

Each command module ``runwatch.cli.<name>`` defines ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args, term) -> int``. Errors raise
:class:`~runwatch.cli.terminal.Abort`; anything else is a bug and is printed as one.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from runwatch.cli.terminal import Abort, Terminal
from runwatch.settings import NotALogDir

#: command -> (module, one-line help). Modules are imported lazily, so a command's heavy
#: dependencies (torch, faust) cost nothing to the others.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("runwatch.cli.demo", "train several real runs and show the whole plane working"),
    "canary": ("runwatch.cli.canary", "inject the four canary faults; fail unless alerts fire"),
    "log": ("runwatch.cli.log", "the embedded log: export from Kafka, cat records"),
    "kafka": ("runwatch.cli.kafka", "a real local Kafka broker: up, down, status"),
    "import": ("runwatch.cli.import_", "import trainer metrics or rollout traces into a log"),
    "replay": ("runwatch.cli.replay", "rebuild every derived event and projection from a log"),
    "audit": ("runwatch.cli.audit", "verify a live projection against a from-scratch replay"),
    "backtest": (
        "runwatch.cli.backtest",
        "replay a recorded run through the detectors: which would have fired, and when",
    ),
    "train": ("runwatch.cli.train", "run the GRPO trainer from a config file"),
    "run": ("runwatch.cli.run", "pause, resume or cancel a run (commands as events)"),
    "resume": ("runwatch.cli.resume", "resume a run through the replay-overlap resume gate"),
    "checkpoint": ("runwatch.cli.checkpoint", "inspect a checkpoint"),
    "sandbox": ("runwatch.cli.sandbox", "check or score a tenant reward function in the sandbox"),
    "profile": ("runwatch.cli.profile", "rollout trace profiles: tables, JSON and plots"),
    "serve": ("runwatch.cli.serve", "serve an HTTP API (query API, trajectories)"),
    "process": ("runwatch.cli.process", "run the stream processors (embedded or faust on Kafka)"),
    "notify": ("runwatch.cli.notify", "deliver customer alerts and state changes to webhooks"),
    "schema": ("runwatch.cli.schema", "export the event contract: JSON Schema and AsyncAPI"),
    "export": ("runwatch.cli.export", "write a run's history to W&B or MLflow"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runwatch", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    term = Terminal(verbose=args.verbose)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args, term) or 0)
    except Abort as exc:
        term.error(str(exc))
        return exc.code
    except NotALogDir as exc:  # --log / $RUNWATCH_LOG_DIR names a file
        term.error(str(exc))
        return 1
    except BrokenPipeError:  # e.g. `runwatch log cat DIR | head`: the reader left
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        term.error("interrupted")
        return 130
    except Exception as exc:  # the one top-level handler: a bug, printed whole
        if getattr(exc, "told_as_is", False):  # the log's state, not a bug (LogDamaged...)
            term.error(str(exc))
            return 1
        term.error("unexpected failure (a bug in runwatch):\n" + traceback.format_exc())
        return 2


if __name__ == "__main__":
    sys.exit(main())
