"""The one thread that forks every sandbox of this host process.

bubblewrap's ``--die-with-parent`` is ``PR_SET_PDEATHSIG``: the kernel kills the sandbox
when the *thread* that forked it exits, not when the process does. A worker spawned
inline by a ``score()`` made from a short-lived thread (one thread per request, a
``ThreadPoolExecutor`` that shrinks or is shut down) was SIGKILLed as soon as that thread
ended, while it waited in the warm pool, and its next batch was booked ``tenant_crash``
("worker gone before the batch"). So every launch forks from one daemon thread that
lives as long as the process: a sandbox dies with its host process (what
``--die-with-parent`` is for), never with a caller's thread.

Assumptions: only the fork/exec runs on that thread (``subprocess.Popen``, milliseconds);
the handshake stays on the caller's thread, so start-ups of different pools still
overlap. File descriptors are process-wide, so ``pass_fds`` opened by the caller are valid
on the spawner thread; the caller closes them after :meth:`Spawner.popen` returns. A child
of ``os.fork`` starts a spawner thread of its own on first use (threads do not survive a
fork).
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

#: How long a caller waits for the spawner thread to fork (it takes milliseconds; this
#: only bounds a wait on a thread that can no longer run, at interpreter shutdown).
SPAWN_WAIT_S = 60.0


@dataclass
class _Job:
    """One ``Popen`` to run on the spawner thread, and its result."""

    argv: list[str]
    kwargs: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    proc: subprocess.Popen[bytes] | None = None
    error: BaseException | None = None


class Spawner:
    """Runs ``subprocess.Popen`` on one long-lived daemon thread (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(argv, **kwargs)`` forked from the spawner thread. Raises what
        ``Popen`` raises (``OSError``...), or ``TimeoutError`` if the thread never ran it."""
        if threading.current_thread() is self._thread:
            return subprocess.Popen(argv, **kwargs)  # already on it: no self-deadlock
        job = _Job(argv, kwargs)
        self._ensure_thread()
        self._queue.put(job)
        if not job.done.wait(SPAWN_WAIT_S):
            raise TimeoutError("the sandbox spawner thread did not run the launch")
        if job.error is not None:
            raise job.error
        assert job.proc is not None
        return job.proc

    @property
    def thread(self) -> threading.Thread | None:
        """The spawner thread (None before the first launch of this process)."""
        return self._thread

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="sandbox-spawner", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        """Fork each queued launch; never exits (its exit would kill every sandbox)."""
        while True:
            job = self._queue.get()
            try:
                job.proc = subprocess.Popen(job.argv, **job.kwargs)
            except Exception as exc:  # handed to the caller, never kills this thread
                job.error = exc
            finally:
                job.done.set()

    def _after_fork_in_child(self) -> None:
        """A forked child has no spawner thread (and maybe a held lock): start afresh."""
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._thread = None


SPAWNER = Spawner()
os.register_at_fork(after_in_child=SPAWNER._after_fork_in_child)
