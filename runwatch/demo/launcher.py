"""A warm launcher: the demo's trainer processes, forked from a process that has imported
the trainer stack once.

Every demo run is its own OS process running the ``runwatch`` CLI (``train`` or
``resume``) in a session of its own, so ``killpg(pid, SIGKILL)`` is a real preemption
and its exit code is the CLI's. Started from scratch, each one first spends ~6 CPU-s
importing torch, transformers and vLLM (measured on the 2-core box: 3.4 s for the
trainer, 2.4 s for vLLM's engine modules), and a demo starts nine of them. The launcher
starts them instead from a ``multiprocessing`` *forkserver* whose process imported those
modules once and moved them out of the garbage collector's sight (:func:`gc.freeze`, so
the collections vLLM runs while starting an engine do not walk them): the way a pool of
pre-warmed workers starts jobs. What a run does after the fork — its vLLM engine, its
log, its checkpoints — is its own, exactly as in a cold process.

Assumptions: Linux ``fork`` semantics; the forkserver process never runs torch compute
(no OpenMP pool exists to be broken by the fork) and is started fresh by
``multiprocessing`` (it does not inherit the demo's state, only its environment).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Imported once by the forkserver (the last one freezes the heap).
PRELOAD = ("runwatch.demo.warm",)


def _child(argv: Sequence[str], out: str, err: str, env: Mapping[str, str]) -> None:
    """Runs in the forked process: own session, output to files, then the CLI."""
    os.setsid()
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (process-long)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    from runwatch.cli.main import main

    code = main(list(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


class Launched:
    """The part of ``subprocess.Popen`` the orchestrator uses, for a forked run."""

    def __init__(self, proc: multiprocessing.process.BaseProcess) -> None:
        self._proc = proc
        self.pid: int = proc.pid or -1

    def poll(self) -> int | None:
        return None if self._proc.is_alive() else self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._proc.join(timeout)
        return self._proc.exitcode


class WarmLauncher:
    """Forks ``runwatch <argv>`` processes from one warm forkserver (started on first use)."""

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(PRELOAD))

    def spawn(
        self, argv: Sequence[str], stdout: Path, stderr: Path, env: Mapping[str, str]
    ) -> Launched:
        proc = self._ctx.Process(
            target=_child, args=(list(argv), str(stdout), str(stderr), dict(env)), daemon=False
        )
        proc.start()
        return Launched(proc)
