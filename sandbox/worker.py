"""One live sandbox worker, seen from the host. No public method raises.

Life: :meth:`SandboxWorker.spawn` acquires the worker's resources (uid, cgroups, scratch,
socketpair, seccomp program) on one :class:`contextlib.ExitStack`, launches
``sh (join cgroups) -> setpriv (drop uid) -> bwrap (namespaces, fs view, seccomp) -> python
worker_main.py``, and does the hello/go/ready handshake. :meth:`score` runs one batch under
the wall-clock deadline. Between the handshake and a batch, and between batches, the worker
is stopped (SIGSTOP): tenant code runs only while a batch of its own is being scored.
:meth:`close` unwinds the stack: kill the process tree, close the socket, unmount and
delete scratch, kill-and-remove the cgroups, release the uid.

Every launch forks from one long-lived thread (:mod:`sandbox.spawner`): bubblewrap's
``--die-with-parent`` fires when the forking *thread* exits, so a worker's life is tied
to its host process, never to a caller's thread.

Cause attribution (host-side evidence wins over what the worker says, and nothing the
tenant sends can put a failure in the platform's column):

- no reply before the deadline -> ``tenant_timeout`` (the sandbox is killed);
- the pids cgroup refused a fork, the memory cgroup OOM-killed, the process died of
  SIGXCPU/SIGXFSZ, the worker's tree spent its ``cpu_seconds`` (cgroup CPU time), or the
  worker reports MemoryError/EAGAIN/EFBIG... -> ``tenant_resource_exceeded``;
- the worker reports an exception, or the process dies -> ``tenant_crash``;
- an oversized, malformed or off-contract reply -> ``tenant_bad_output``;
- failures before tenant code ran (spawn, handshake up to ``hello``) -> ``platform_error``;
- without such evidence, the sandbox killed from outside is not the tenant's: bubblewrap's
  monitor killed by a signal (it lives outside the sandbox's pid namespace: nothing
  inside can signal it), or a worker found killed (SIGKILL) before its batch while it
  was stopped (no tenant code ran since the host stopped it; only SIGKILL ends a stopped
  process, and the kernel drops one sent to a namespace's pid 1 from inside) ->
  ``platform_error`` marked ``killed_outside``, which the client retries on a fresh
  worker without booking;
- a worker that ran while it waited stopped between batches (its context switches moved,
  or it exited otherwise than by SIGKILL): its own code continued it (a timer or a signal
  it arranged; nothing of the host's continues it before its batch) -> ``tenant_crash``,
  and the batch is never handed to it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sandbox.features import KernelFeatures, default_worker_python
from sandbox.gate import check_scores
from sandbox.isolation import (
    UIDS,
    ArtifactBundle,
    Cgroup,
    bwrap_argv,
    empty_dir,
    launch_argv,
    scratch_dir,
    worker_cgroups,
    worker_name,
)
from sandbox.protocol import (
    Frame,
    RecvError,
    error_kind,
    error_message,
    recv_frame,
    send_frame,
)
from sandbox.seccomp_policy import compiled_filter
from sandbox.spawner import SPAWNER
from sandbox.text import clean_text
from sandbox.types import AttemptResult, AttemptStatus, Cause, SandboxConfig

_COUNTER = itertools.count()

KIND_TO_CAUSE = {
    "crash": Cause.TENANT_CRASH,
    "resource": Cause.TENANT_RESOURCE_EXCEEDED,
    "bad_output": Cause.TENANT_BAD_OUTPUT,
}


#: How long a stopped worker found not stopped any more is given to be seen dead (a
#: SIGKILL from outside wakes it to die) before it is judged to have run (seconds).
DYING_S = 0.5


def _failed(
    cause: Cause, started: float, message: str, examples: tuple[str, ...] = ()
) -> AttemptResult:
    return AttemptResult(
        AttemptStatus.FAILED, cause, None, time.monotonic() - started, clean_text(message), examples
    )


def _killed_outside(started: float, message: str) -> AttemptResult:
    """The worker was killed from outside the sandbox and nothing points at the tenant:
    the platform's, and the client retries it on a fresh worker before booking it."""
    return AttemptResult(
        AttemptStatus.FAILED,
        Cause.PLATFORM_ERROR,
        None,
        time.monotonic() - started,
        clean_text(message),
        killed_outside=True,
    )


class SandboxWorker:
    """A spawned, handshaken sandbox running one tenant artifact."""

    def __init__(self, config: SandboxConfig, tenant_id: str, bundle: ArtifactBundle) -> None:
        self.config = config
        self.tenant_id = tenant_id
        self.bundle = bundle
        self.name = worker_name(next(_COUNTER))
        self.uid: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.scratch: Path | None = None
        self.cgroups: dict[str, Cgroup] = {}
        self.baseline: set[int] = set()
        self.worker_pid: int | None = None  # host pid of the worker (the sandbox's pid 1)
        self._pidfd: int | None = None  # of the worker: stops it between batches
        self._stat_fd: int | None = None  # the worker's /proc/<pid>/stat: its thread count
        self._status_fd: int | None = None  # its /proc/<pid>/status: its context switches
        self._wchan_fd: int | None = None  # its /proc/<pid>/wchan: off its run queue?
        self._cpu_fd: int | None = None  # its tree's cpuacct.usage: the CPU budget
        self.batches = 0
        self.alive = False
        self.dirty = False  # tenant code left threads behind: retire after this batch
        self._stopped = False  # stopped by the host and not continued since
        #: its context-switch counters once stopped (b"": unreadable; None: not stopped)
        self._stopped_at: bytes | None = None
        self._gone_while_stopped = False  # found dead before it was continued
        self._aborted = False  # start-up called off from another thread (abort())
        self._stack = contextlib.ExitStack()
        self._ids = itertools.count(1)
        self._stderr: Any = None

    # -- life cycle ---------------------------------------------------------------------

    @classmethod
    def spawn(
        cls,
        config: SandboxConfig,
        tenant_id: str,
        bundle: ArtifactBundle,
        features: KernelFeatures,
        *,
        on_create: Callable[[SandboxWorker], None] | None = None,
    ) -> tuple[SandboxWorker | None, AttemptResult | None]:
        """Start a worker; returns (worker, None) or (None, failed attempt).

        ``on_create`` gets the worker before it starts, so another thread can
        :meth:`abort` the start-up (a pool suspended while it pre-spawns)."""
        started = time.monotonic()
        worker = cls(config, tenant_id, bundle)
        if on_create is not None:
            on_create(worker)
        try:
            failure = worker._start(features, started)
        except Exception as exc:
            failure = _failed(Cause.PLATFORM_ERROR, started, f"spawn failed: {exc!r}")
        if failure is not None:
            worker.close()
            return None, failure
        return worker, None

    def _start(self, features: KernelFeatures, started: float) -> AttemptResult | None:
        cfg, limits, layers = self.config, self.config.limits, self.config.layers
        st = self._stack
        uid = UIDS.acquire() if "unprivileged_uid" in layers and features.is_root else None
        if uid is not None:
            self.uid = uid
            st.callback(UIDS.release, uid)
        elif "unprivileged_uid" in layers and features.is_root:
            return _failed(Cause.PLATFORM_ERROR, started, "no free sandbox uid")
        self.cgroups = st.enter_context(worker_cgroups(self.name, limits, features, layers))
        self._cpu_fd = self._open_cpu_usage()
        if self._cpu_fd is not None:
            st.callback(os.close, self._cpu_fd)
        self.scratch = st.enter_context(
            scratch_dir(
                self.name, uid if uid is not None else os.getuid(), limits, features, layers
            )
        )
        host_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = host_sock
        st.callback(host_sock.close)
        seccomp_fd = None
        if "seccomp" in layers and features.usable.get("seccomp"):
            seccomp_fd = os.memfd_create("rw-seccomp", 0)
            os.write(seccomp_fd, compiled_filter())
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
        # bwrap copies these into the sandbox (--ro-bind-data) and closes them
        artifact_fd = os.open(self.bundle.artifact_dir / "reward.py", os.O_RDONLY)
        runtime_fd = os.open(self.bundle.runtime_dir / "worker_main.py", os.O_RDONLY)
        nproc = -1 if "pids" in self.cgroups else limits.pids
        if uid is None:
            nproc = -1  # not our own uid: RLIMIT_NPROC would count the host's processes
        inner = bwrap_argv(
            features=features,
            layers=layers,
            scratch=self.scratch,
            python=cfg.worker_python or default_worker_python(),
            fd=child_sock.fileno(),
            seccomp_fd=seccomp_fd,
            artifact_fd=artifact_fd,
            runtime_fd=runtime_fd,
        )
        argv = launch_argv(uid=uid, setpriv=features.setpriv, cgroups=self.cgroups, inner=inner)
        self._stderr = st.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
        try:
            pass_fds = (child_sock.fileno(), artifact_fd, runtime_fd)
            pass_fds += (seccomp_fd,) if seccomp_fd is not None else ()
            # forked by the process's one spawner thread: --die-with-parent follows the
            # forking thread, and a caller's thread may end while the worker waits
            self.proc = SPAWNER.popen(
                argv,
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                pass_fds=pass_fds,
                close_fds=True,
                start_new_session=True,
            )
        finally:
            child_sock.close()
            for extra in (seccomp_fd, artifact_fd, runtime_fd):
                if extra is not None:
                    os.close(extra)
        st.callback(self._kill)
        if self._aborted:  # abort() ran before the process existed to kill
            return _failed(Cause.PLATFORM_ERROR, started, "start-up called off")
        deadline = started + limits.startup_s
        # the limits travel over the socket, not argv: /proc/1/cmdline shows nothing of ours
        err = send_frame(host_sock, {"op": "limits", **asdict(limits), "nproc": nproc}, deadline)
        if err:
            return _failed(Cause.PLATFORM_ERROR, started, f"worker did not start: {err}")
        hello = recv_frame(host_sock, deadline, 4096)
        if hello.message is None or hello.message.get("op") != "hello":
            return _failed(
                Cause.PLATFORM_ERROR, started, f"worker did not start: {self._stderr_tail()}"
            )
        self.baseline = self._procs()
        err = send_frame(host_sock, {"op": "go"}, deadline)
        if err:
            return _failed(Cause.PLATFORM_ERROR, started, f"handshake failed: {err}")
        ready = recv_frame(host_sock, deadline, limits.max_output_bytes, self._cpu_watch())
        msg = ready.message
        if ready.error is not RecvError.CUT and self._over_cpu_budget():
            return _failed(
                Cause.TENANT_RESOURCE_EXCEEDED, started, "loading the artifact: " + self._cpu_note()
            )
        if msg is not None and msg.get("op") == "ready":
            self.alive = True
            self.worker_pid = self._leaf(self.baseline)
            self._pidfd = self._open_pidfd(self.worker_pid)
            if self._pidfd is not None:
                st.callback(os.close, self._pidfd)
            with contextlib.suppress(OSError):  # kept open: one pread per batch (11 us)
                self._stat_fd = os.open(f"/proc/{self.worker_pid}/stat", os.O_RDONLY)
                st.callback(os.close, self._stat_fd)
            with contextlib.suppress(OSError):
                self._status_fd = os.open(f"/proc/{self.worker_pid}/status", os.O_RDONLY)
                st.callback(os.close, self._status_fd)
            with contextlib.suppress(OSError):
                self._wchan_fd = os.open(f"/proc/{self.worker_pid}/wchan", os.O_RDONLY)
                st.callback(os.close, self._wchan_fd)
            if self._threads() != 1:
                self.dirty = True  # tenant code started a thread at import: one batch only
            # the worker first, then what its import started (killed, not stopped: the
            # artifact can send "ready" itself and fork past any scan; see _clear_strays)
            stopped_at = self._stop_worker()
            if self._pidfd is not None and stopped_at is None:
                return _failed(Cause.TENANT_CRASH, started, "the worker did not stop in 1 s")
            if self._group() is not None:  # without any cgroup none can be found
                strays = self._clear_strays()
                if strays is None:
                    return _failed(
                        Cause.TENANT_CRASH, started, "processes started at import kept forking"
                    )
                if strays:
                    self.dirty = True  # and processes: one batch only
            if stopped_at is not None and not self._still_stopped(stopped_at):
                return _failed(Cause.TENANT_CRASH, started, "the stopped worker was continued")
            self._stopped, self._stopped_at = stopped_at is not None, stopped_at
            return None
        if msg is not None and msg.get("op") == "load_error":
            cause = KIND_TO_CAUSE[error_kind(msg)]
            return _failed(
                self._resource_evidence(cause),
                started,
                "loading the artifact failed: " + error_message(msg),
            )
        return self._frame_failure(ready, started, "loading the artifact")

    def close(self) -> None:
        """Tear everything down (idempotent; every step runs even if another fails)."""
        self.alive = False
        with contextlib.suppress(Exception):
            self._stack.close()

    @property
    def aborted(self) -> bool:
        """:meth:`abort` called off this worker's start-up."""
        return self._aborted

    def abort(self) -> None:
        """Call off a start-up from another thread (the pool was suspended or closed):
        the sandbox's processes are killed, so the starting thread's handshake ends at
        once and :meth:`spawn` returns a failure. Never raises, never waits."""
        self._aborted = True  # before reading proc: _start reads it after setting proc
        with contextlib.suppress(Exception):
            self._signal_tree()

    def _signal_tree(self) -> None:
        """SIGKILL every process of the sandbox (its cgroups, then its process group)."""
        proc = self.proc
        if proc is None:
            return
        for cg in self.cgroups.values():
            cg.kill_all()
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                proc.kill()

    def _kill(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            self._signal_tree()
        finally:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)

    # -- one batch ----------------------------------------------------------------------

    def score(self, batch: list[dict[str, Any]]) -> AttemptResult:
        """Score one batch under the deadline; the worker is retired on any failure."""
        started = time.monotonic()
        if not self.alive or self.sock is None:
            return _failed(Cause.PLATFORM_ERROR, started, "worker is not alive")
        self.batches += 1
        self._counters_before = self._resource_counters()
        deadline = started + self.config.limits.deadline_s
        rid = next(self._ids)
        if self._stopped and (
            self._exited() or (self._ran_while_stopped() and self._exited(DYING_S))
        ):
            # dead while stopped, before this batch: killed (SIGKILL) from outside, or its
            # own code ran after all (see _died); a SIGKILL wakes a stopped process to
            # die, so one not stopped any more is given a moment to be seen dead
            self.alive = False
            return self._gone_before_batch(started, "found dead while it waited")
        if self._stopped and self._ran_while_stopped():
            # found by review: a POSIX timer of the tenant's sent SIGCONT after the host's
            # last look, and its code ran (forked, burned CPU, raced the scratch cleanup)
            # through every wait; the filter now refuses timer_create, and whatever else
            # continues it is caught here: the batch never reaches such a worker
            self.alive = False
            return _failed(
                Cause.TENANT_CRASH,
                started,
                "the worker ran while it waited stopped between batches (its own code "
                "continued it: a timer or a signal it arranged); retired",
            )
        # the stopped worker is continued once its batch is in the socket (a large batch:
        # before the send, which would wait for it to read)
        msg_out = {"op": "score", "id": rid, "batch": batch}
        err = send_frame(self.sock, msg_out, deadline, before_blocking=self._thaw)
        if err:
            self.alive = False
            return self._gone_before_batch(started, err)
        frame = recv_frame(
            self.sock, deadline, self.config.limits.max_output_bytes, self._cpu_watch()
        )
        msg = frame.message
        if msg is None:
            self.alive = False
            return self._frame_failure(frame, started, "scoring")
        if self._over_cpu_budget():
            # the tree's CPU over the worker's life, children included (RLIMIT_CPU alone is
            # per process: a fresh child per batch never reached it)
            self.alive = False
            return _failed(Cause.TENANT_RESOURCE_EXCEEDED, started, "scoring: " + self._cpu_note())
        op = msg.get("op")
        if op == "error" and msg.get("id") == rid:
            self.alive = False
            cause = self._resource_evidence(KIND_TO_CAUSE[error_kind(msg)])
            return _failed(cause, started, error_message(msg))
        if op != "result" or msg.get("id") != rid:
            self.alive = False
            return _failed(Cause.TENANT_BAD_OUTPUT, started, f"off-contract reply op={op!r}")
        threads = msg.get("threads")
        if not isinstance(threads, int) or threads != 1:
            # tenant code left a thread running (or hid the count): these scores stand,
            # but this process is never handed another batch
            self.dirty = True
        gate = check_scores(msg.get("scores"), len(batch), self.config.score_range)
        if not gate.ok:
            self.alive = False
            cause = self._resource_evidence(Cause.TENANT_BAD_OUTPUT)
            return _failed(cause, started, gate.message, gate.examples)
        return AttemptResult(
            AttemptStatus.FINISHED, Cause.OK, gate.scores, time.monotonic() - started
        )

    def reset_between_batches(self) -> bool:
        """Kill processes the tenant left behind, empty scratch, stop the worker until its
        next batch. False: retire the worker.

        The worker is stopped (SIGSTOP) first, and stays stopped until :meth:`score`
        continues it, so no tenant code (a SIGCHLD handler forking a replacement for each
        process killed, a signal handler, a patched receive loop) runs from here on. Then
        everything but the baseline (bubblewrap's monitor outside the sandbox and the
        worker, the sandbox's pid 1) is killed through the worker's cgroup, until none is
        left (else retired), and scratch emptied. Whether tenant code left a thread running
        in the worker is read on the host (``/proc/<pid>/stat``), never taken from the
        worker's own report (tenant code can rewrite the worker's module); such a worker is
        retired. Without any cgroup strays cannot be found: the worker is retired after
        every batch.
        """
        if not self.alive or self.dirty:
            return False
        try:
            if self._group() is None or self._threads() != 1:
                return False
            # stopped before the kill: a SIGCHLD handler of the worker's would fork a
            # replacement for every process killed
            stopped_at = self._stop_worker()
            if self._pidfd is not None and stopped_at is None:
                return False
            if self._clear_strays() is None:
                return False
            if self._threads() != 1:
                return False
            # nothing of the tenant's runs to write to it now; not emptied whole: retired
            if self.scratch is not None and not empty_dir(self.scratch):
                return False
            # a stray may have continued the worker (SIGCONT) before it was killed, and the
            # worker then stopped itself again: retired, whatever it did meanwhile
            if stopped_at is not None and not self._still_stopped(stopped_at):
                return False
            self._stopped, self._stopped_at = stopped_at is not None, stopped_at
            return self.proc is not None and self.proc.poll() is None
        except Exception:
            return False

    def _group(self) -> Cgroup | None:
        """A cgroup holding the worker's whole tree (any controller will do)."""
        for key in ("pids", "memory", "cpu"):
            if key in self.cgroups:
                return self.cgroups[key]
        return None

    def _stop_worker(self) -> bytes | None:
        """Stop the worker (SIGSTOP from the parent pid namespace reaches the sandbox's
        pid 1; its threads stop with it) and wait until it is stopped: no tenant code (a
        signal handler, a patched receive loop) runs until :meth:`score` continues it.
        Signalled through a pidfd, so a dead worker's recycled pid is never hit. Returns
        its context-switch counters once stopped and switched out (:meth:`_switches`; b""
        where they cannot be read), for :meth:`_still_stopped`; None: not stopped within a
        second, or no pidfd (kernel < 5.3: the worker is never stopped)."""
        if self._pidfd is None:
            return None
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGSTOP)
        except OSError:
            return None
        if self._stat_fd is None:  # nothing to see it by (opened with the pidfd: rare)
            return b""
        start = time.monotonic()
        deadline = start + 1.0
        while True:  # tens of microseconds, unless the box is busy
            now = time.monotonic()
            if now > deadline:
                return None
            # "T" shows just before the switch out that counts, and the wait channel once
            # the worker is off its run queue; the counters then read twice, 5 us apart
            if self._state() in (b"T", b"t") and self._off_cpu():
                switches = self._switches()
                settle = time.perf_counter() + 0.000005
                while time.perf_counter() < settle:
                    pass
                if self._switches() == switches:
                    return switches
            if now - start > 0.0002:  # spin the first 200 us, then sleep between looks
                time.sleep(0.00005)

    def _clear_strays(self) -> int | None:
        """Kill every process of the sandbox but the baseline (bubblewrap's monitor and
        the worker, stopped first by the caller): how many there were, or None when some
        kept forking past the kill (the caller retires the worker; its pid namespace dies
        with it). Stopping them instead cannot be made to hold: a running one continues
        (SIGCONT) one already stopped, or one stops itself to pass a check."""
        group = self._group()
        if group is None:
            return None
        found = len(group.procs() - self.baseline)
        if not group.kill_all(keep=self.baseline):
            return None
        return found

    def _thaw(self) -> None:
        """Continue the stopped worker; first note whether it was already dead (then no
        tenant code ran since the host stopped it: see :meth:`_gone_before_batch`)."""
        if self._stopped:
            self._gone_while_stopped = self._exited()
            self._stopped = False
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGCONT)

    def _exited(self, wait_s: float = 0.0) -> bool:
        """The worker process has exited (its pidfd is readable, within ``wait_s``); False
        when unknown."""
        if self._pidfd is None:
            return False
        try:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            return bool(poller.poll(int(wait_s * 1000)))
        except (OSError, ValueError):
            return False

    def _switches(self) -> bytes:
        """The worker's context-switch counters from the host's ``/proc/<pid>/status``
        (b"" unknown): a stopped process that is continued and runs, even if it stops
        itself again, counts at least one more."""
        if self._status_fd is None:
            return b""
        try:
            status = os.pread(self._status_fd, 4096, 0)
        except OSError:
            return b""
        return b" ".join(
            line.split()[-1] for line in status.splitlines() if b"ctxt_switches:" in line
        )

    def _off_cpu(self) -> bool:
        """The worker is off its CPU's run queue (its ``wchan`` names where it sleeps);
        True where that cannot be read."""
        if self._wchan_fd is None:
            return True
        try:
            return os.pread(self._wchan_fd, 64, 0) not in (b"0", b"")
        except OSError:
            return True

    def _ran_while_stopped(self) -> bool:
        """The stopped worker ran since the host stopped it (its counters moved, or it is
        not stopped any more), though nothing of the host's continued it."""
        return self._stopped_at is not None and not self._still_stopped(self._stopped_at)

    def _still_stopped(self, stopped_at: bytes) -> bool:
        """Stopped now, and not run since its counters read ``stopped_at`` (b"": they
        cannot be read, only the state is; no stat file either: nothing to check by)."""
        if self._stat_fd is None:
            return True
        return self._state() in (b"T", b"t") and self._switches() == stopped_at

    def _state(self) -> bytes:
        """The worker's state letter from the host's ``/proc/<pid>/stat`` (b"" unknown)."""
        if self._stat_fd is None:
            return b""
        try:
            return os.pread(self._stat_fd, 1024, 0).rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return b""

    @staticmethod
    def _open_pidfd(pid: int | None) -> int | None:
        if pid is None:
            return None
        try:
            return os.pidfd_open(pid)
        except (OSError, AttributeError):  # kernel < 5.3: the worker is not stopped
            return None

    def _threads(self) -> int:
        """Threads of the worker process, read on the host (-1 if unknown). The stat file
        stays open (re-read from offset 0): it names this process, never a recycled pid."""
        if self._stat_fd is None:
            return -1
        try:
            fields = os.pread(self._stat_fd, 1024, 0).rsplit(b")", 1)[1].split()
            return int(fields[17])  # field 20, num_threads (fields[0] is field 3)
        except (OSError, ValueError, IndexError):
            return -1

    @staticmethod
    def _leaf(pids: set[int]) -> int | None:
        """The one process of ``pids`` that is no other's parent: the worker, below
        bubblewrap's monitor (and bubblewrap's init, without ``own_pid1``)."""
        parents: dict[int, int] = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    parents[pid] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return None
        leaves = [pid for pid in pids if pid not in parents.values()]
        return leaves[0] if len(leaves) == 1 else None

    # -- evidence -----------------------------------------------------------------------

    def _procs(self) -> set[int]:
        for key in ("pids", "memory"):
            if key in self.cgroups:
                return self.cgroups[key].procs()
        return set()

    def _resource_counters(self) -> tuple[int, int]:
        pids = self.cgroups.get("pids")
        mem = self.cgroups.get("memory")
        return (
            pids.read_counter("pids.events", "max") if pids else 0,
            mem.read_counter("memory.oom_control", "oom_kill") if mem else 0,
        )

    def _resource_evidence(self, cause: Cause) -> Cause:
        """Upgrade a tenant failure to resource_exceeded when a cgroup limit fired."""
        if cause is Cause.PLATFORM_ERROR:
            return cause
        before = getattr(self, "_counters_before", (0, 0))
        now = self._resource_counters()
        if now[0] > before[0] or now[1] > before[1]:
            return Cause.TENANT_RESOURCE_EXCEEDED
        return cause

    def _death_cause(self) -> Cause:
        """Why the sandbox died: resource evidence first, then who could have killed it.

        bubblewrap's monitor (``self.proc``) exits with its child's status (128 + the
        signal that killed it); a negative return code means the monitor itself was
        killed by a signal, which nothing inside the sandbox can send (the monitor is
        outside its pid namespace): the platform's (PDEATHSIG, an operator, the host's
        OOM killer), unless a cgroup or rlimit says the tenant ran out of something."""
        rc = None
        if self.proc is not None:
            try:
                rc = self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                rc = None
        if rc is not None and rc in (128 + signal.SIGXCPU, 128 + signal.SIGXFSZ):
            return Cause.TENANT_RESOURCE_EXCEEDED
        if rc == 128 + signal.SIGKILL and self._cpu_used() >= 0.95 * self.config.limits.cpu_seconds:
            # RLIMIT_CPU at its hard limit kills with SIGKILL (and the sandbox's pid 1
            # ignores SIGXCPU): the group's CPU time is the evidence
            return Cause.TENANT_RESOURCE_EXCEEDED
        if self._over_cpu_budget():
            return Cause.TENANT_RESOURCE_EXCEEDED
        cause = self._resource_evidence(Cause.TENANT_CRASH)
        if cause is Cause.TENANT_CRASH and rc is not None and rc < 0:
            return Cause.PLATFORM_ERROR
        return cause

    def _gone_before_batch(self, started: float, why: str) -> AttemptResult:
        """The worker was gone before its batch was in its socket (``why``: the send's
        error, or how it was found): see :meth:`_died`."""
        return self._died(started, f"worker gone before the batch: {why}")

    def _died(self, started: float, message: str) -> AttemptResult:
        """The worker died. Resource evidence books the tenant; one killed (SIGKILL) while
        stopped (no tenant code ran since the host stopped it), or whose monitor was
        killed by a signal, was killed from outside: the platform's, ``killed_outside``
        (retried on a fresh worker before it is booked); any other death, the tenant's —
        a stopped worker that exited otherwise ran after all (only SIGKILL ends a stopped
        process): its own code continued it (review: a timer's SIGCONT, then ``_exit(3)``,
        was booked to the platform at every batch)."""
        cause = self._death_cause()
        rc = self.proc.returncode if self.proc is not None else None
        if cause is Cause.TENANT_RESOURCE_EXCEEDED:
            return _failed(cause, started, f"{message} (exit {rc})")
        killed = rc is None or rc < 0 or rc == 128 + signal.SIGKILL
        if cause is Cause.PLATFORM_ERROR or (
            killed and (self._gone_while_stopped or self._stopped)
        ):
            return _killed_outside(started, f"{message}: killed outside the sandbox (exit {rc})")
        if self._gone_while_stopped or self._stopped:
            message += ": it exited while stopped, so its own code had continued it"
        return _failed(cause, started, f"{message} (exit {rc})")

    def _cpu_watch(self) -> Callable[[], bool] | None:
        """What a receive asks every 0.1 s: is the CPU budget spent? None without a cgroup
        that counts CPU (then RLIMIT_CPU, per process, is the only bound)."""
        if self._cpu_fd is None and not any(key in self.cgroups for key in ("cpuacct", "cpu")):
            return None
        return self._over_cpu_budget

    def _over_cpu_budget(self) -> bool:
        """The worker's tree (every process it ever had) used more than ``cpu_seconds``."""
        return self._cpu_used() > self.config.limits.cpu_seconds

    def _cpu_note(self) -> str:
        used, limit = self._cpu_used(), self.config.limits.cpu_seconds
        return (
            f"cpu_seconds exhausted: the worker's processes used {used:.2f} CPU-s "
            f"of {limit} (its whole life, children included)"
        )

    def _open_cpu_usage(self) -> int | None:
        """An fd on the tree's ``cpuacct.usage`` (kept open: one pread per look)."""
        for key in ("cpuacct", "cpu"):
            if key in self.cgroups:
                with contextlib.suppress(OSError):
                    return os.open(self.cgroups[key].path / "cpuacct.usage", os.O_RDONLY)
        return None

    def _cpu_used(self) -> float:
        """CPU seconds of the worker's tree so far, exited processes included (0.0 when
        no cgroup counts them)."""
        if self._cpu_fd is not None:
            with contextlib.suppress(OSError, ValueError):
                return int(os.pread(self._cpu_fd, 64, 0)) / 1e9
        for key in ("cpuacct", "cpu"):
            if key in self.cgroups:
                used = self.cgroups[key].cpu_seconds()
                if used:
                    return used
        return 0.0

    def _frame_failure(self, frame: Frame, started: float, what: str) -> AttemptResult:
        if frame.error is RecvError.CUT:
            self._kill()
            return _failed(Cause.TENANT_RESOURCE_EXCEEDED, started, f"{what}: {self._cpu_note()}")
        if frame.error is RecvError.TIMEOUT:
            self._kill()
            cause = self._resource_evidence(Cause.TENANT_TIMEOUT)
            return _failed(cause, started, f"{what}: no reply within the deadline")
        if frame.error is RecvError.EOF:
            return self._died(started, f"{what}: worker died")
        cause = self._resource_evidence(Cause.TENANT_BAD_OUTPUT)
        return _failed(
            cause,
            started,
            f"{what}: {frame.error.value if frame.error else ''} {frame.detail}".strip(),
        )

    def _stderr_tail(self) -> str:
        try:
            if self.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=1.0)
            self._stderr.seek(0)
            return self._stderr.read()[-1000:].decode(errors="replace").strip() or "no output"
        except Exception:
            return "no output"
