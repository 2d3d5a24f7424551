"""The framework-neutral live hook: a training loop's facts as runwatch events, live.

:class:`RunwatchHook` is what the TRL callback and the verl tracking backend wrap, and
what a plain Python loop uses directly::

    hook = RunwatchHook("my-run", tenant_id="me")            # embedded log by default
    for step in range(n):
        hook.log({"reward": r, "kl": kl}, step=step)         # TRL or verl keys, as they are
    hook.close()

Facts and the events they become (ids uuid4; ``seq`` dense per hook; ``ts`` the training
thread's wall clock at the call). Each hook is a producer of its own: ``hook/<run>/<12 hex>``
(or ``<producer>/<12 hex>``), because the envelope's ``seq`` must only grow under one
producer name and a restarted process (a TRL run resumed from its checkpoint, a verl job
started again) counts from 0: under a shared name, accounting took the new process's usage
for redeliveries of the old one's and billed none of it until its ``seq`` passed the old
one's. A retry or a re-shipped spool carries the events as they were, name and ``seq``
included, so those are still billed once.

- :meth:`start` -> ``RunSubmitted`` (algorithm, config) + ``RunStarted``; a run started
  from a checkpoint (``resumed_from``) -> ``RunResumed`` instead; the first :meth:`log`
  of a hook not started starts it;
- :meth:`log` -> what ``runwatch import metrics`` writes for the same row
  (:mod:`producers.hooks.mapping`);
- :meth:`step_done` -> ``StepPhaseTimed`` (the step's wall time) and, with ``gpus``,
  ``UsageRecorded``; skipped when the logged row already had ``timing_s/step``;
- :meth:`checkpoint` -> ``CheckpointWritten`` once the files are digested (on the worker
  thread: per-file sentinels ``crc32:``/``sha256:``, the digest a sha256 over them,
  ``checkpoint_schema`` 0 = a framework's own layout, not runwatch's trainer format);
- :meth:`finish` -> ``RunCompleted`` or ``RunFailed`` (reason; the class is left to the
  attribution projection). An uncaught exception ending the process publishes
  ``RunFailed`` too (``sys.excepthook`` is chained), and ``atexit`` closes the hook.

Every call returns at once and never raises into the training loop: the work is done by
a :class:`~producers.hooks.publisher.Publisher` (bounded queue, worker thread, local
spool when the log is unreachable). Where events go: ``gateway=URL`` with
``api_key=KEY`` (or ``$RUNWATCH_GATEWAY`` / ``$RUNWATCH_API_KEY``: the ingest gateway,
``runwatch serve ingest``; what a customer's process should use, as it then holds no
broker credentials and can only publish its own tenant's hook events:
:mod:`runwatch.apps.ingest_policy`; there a run's id is ``<tenant>:<run_id>``,
:func:`tenant_run_id`, so no other tenant can take it), else ``kafka=BOOTSTRAP``
(or ``$RUNWATCH_KAFKA``), else the embedded log ``log=DIR`` (or ``$RUNWATCH_LOG_DIR``, else
``./runwatch-data/log``). The spool defaults to ``./runwatch-data/spool/<run>``
(``$RUNWATCH_SPOOL_DIR`` is its parent).

Unmonitored for too long: a hook that has been unable to deliver its events or to read
its commands for ``pause_when_unmonitored_s`` (300 s by default; ``None``: never) holds
the run at its next :meth:`obey`, as a pause does, until runwatch is reachable, the
spooled events delivered and the commands read (:mod:`producers.hooks.unmonitored`).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import sys
import threading
import time
import uuid
import weakref
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

from events.catalog.checkpoint import CheckpointWritten
from events.catalog.lifecycle import (
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.catalog.trainer import StepPhaseTimed
from events.catalog.usage import UsageRecorded
from events.envelope import EventBase
from events.identity import check_id, check_name
from producers.hooks.mapping import normalized, row_events, scalar
from producers.hooks.obey import MAX_TEXT_CHARS, CommandFollower, cut_payload, cut_text
from producers.hooks.publisher import Publisher, Stats, Target
from producers.hooks.unmonitored import (
    DEFAULT_PAUSE_WHEN_UNMONITORED_S,
    UnmonitoredGuard,
    check_limit,
)
from producers.metrics_import import MetricsImportReport, billed_seconds, check_gpus

log = logging.getLogger("runwatch.hooks")

DigestAlgo = Literal["crc32", "sha256", "none"]
#: Config values kept on ``RunSubmitted`` (scalars only, at most this many).
MAX_CONFIG_KEYS = 64
#: Characters of one config value kept on RunSubmitted (a long list is cut, and says so).
MAX_CONFIG_CHARS = MAX_TEXT_CHARS


def default_log_dir() -> Path:
    return Path(os.environ.get("RUNWATCH_LOG_DIR") or Path("runwatch-data") / "log")


#: What separates a tenant from its own name for a run behind the gateway (a tenant id
#: holds none: :mod:`projections.keys`); the gateway's ``ingest_policy.RUN_SEPARATOR``,
#: which this module does not import (a hook imports nothing of the server's).
TENANT_SEPARATOR = ":"


def tenant_run_id(tenant_id: str, run_id: str) -> str:
    """The id of the run the customer calls ``run_id`` behind the ingest gateway:
    ``<tenant_id>:<run_id>`` (as it is when it already begins so). The gateway takes a
    hook's events only under its own tenant's prefix, so two customers' ``exp-1`` are two
    runs, and no tenant can claim another's run id before its first event
    (:mod:`runwatch.apps.ingest_policy`)."""
    prefix = f"{tenant_id}{TENANT_SEPARATOR}"
    return run_id if run_id.startswith(prefix) else prefix + run_id


def default_spool(run_id: str) -> Path:
    root = Path(os.environ.get("RUNWATCH_SPOOL_DIR") or Path("runwatch-data") / "spool")
    return root / re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)


class RunwatchHook:
    """Live publishing of one run's training facts (see the module docstring)."""

    def __init__(
        self,
        run_id: str,
        tenant_id: str = "default",
        *,
        kafka: str | None = None,
        log: str | os.PathLike[str] | None = None,
        gateway: str | None = None,
        api_key: str | None = None,
        spool: str | os.PathLike[str] | None = None,
        algorithm: str = "grpo",
        gpus: float | None = None,
        producer: str | None = None,
        checkpoint_digest: DigestAlgo = "crc32",
        queue_size: int = 10_000,
        write_timeout_s: float = 10.0,
        connect_timeout_s: float = 30.0,
        retry_s: float = 1.0,
        install_exit_hooks: bool = True,
        follow_commands: bool = True,
        command_poll_s: float = 0.5,
        pause_when_unmonitored_s: float | None = DEFAULT_PAUSE_WHEN_UNMONITORED_S,
    ) -> None:
        """``pause_when_unmonitored_s``: hold the run at :meth:`obey` once the hook has
        been unable to deliver its events or read its commands that long, until both work
        again (:mod:`producers.hooks.unmonitored`; ``None``: train on unmonitored; needs
        ``follow_commands``)."""
        try:
            pause_when_unmonitored_s = check_limit(pause_when_unmonitored_s)
        except ValueError as exc:
            raise ValueError(f"RunwatchHook: {exc}") from None
        gateway = gateway or os.environ.get("RUNWATCH_GATEWAY") or None
        if gateway:  # run ids are per tenant there: no other tenant can take this one
            named, run_id = run_id, tenant_run_id(tenant_id, run_id)
            if run_id != named:
                logging.getLogger("runwatch.hooks").info(
                    "runwatch: behind the gateway run %r is %r", named[:80], run_id[:120]
                )
        for what, value in (("run_id", run_id), ("tenant_id", tenant_id)):
            try:
                check_id(value)  # refused here, not by the first event on the worker thread
            except ValueError as exc:
                raise ValueError(f"RunwatchHook: bad {what} {value[:80]!r}: {exc}") from None
        #: the run's id on the log (behind a gateway ``<tenant>:<run_id>``)
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.algorithm = algorithm
        try:
            self.gpus = check_gpus(gpus)
        except ValueError as exc:
            raise ValueError(f"RunwatchHook: {exc}") from None
        try:  # one producer per hook (see the module docstring): a restart is a new one
            self.producer = check_name(f"{producer or f'hook/{run_id}'}/{uuid.uuid4().hex[:12]}")
        except ValueError as exc:
            raise ValueError(f"RunwatchHook: bad producer {str(producer)[:80]!r}: {exc}") from None
        self.checkpoint_digest = checkpoint_digest
        self.report = MetricsImportReport()
        kafka = None if gateway else kafka or os.environ.get("RUNWATCH_KAFKA") or None
        log_dir = Path(log) if log else default_log_dir()
        open_reader: Callable[[], Any] | None = None
        if gateway:
            target, open_reader = self._gateway(gateway, api_key, write_timeout_s)
        elif kafka:
            target = Target.kafka(kafka, write_timeout_s)
        else:
            target = Target.embedded(log_dir)
        #: the run's commands, acted on at :meth:`obey` (None: ``follow_commands=False``)
        self.follower: CommandFollower | None = None
        if follow_commands:
            self.follower = CommandFollower(
                run_id,
                tenant_id,
                kafka=kafka,
                log_dir=log_dir,
                backend=open_reader,
                publish=self._publish_now,
                flush=lambda: self.flush(write_timeout_s),
                poll_s=command_poll_s,
                producer=self.producer,
            )
        self.publisher = Publisher(
            target,
            Path(spool) if spool else default_spool(run_id),
            queue_size=queue_size,
            write_timeout_s=write_timeout_s,
            connect_timeout_s=connect_timeout_s,
            retry_s=retry_s,
        )
        #: holds the run when runwatch is out of touch too long (None: off)
        self.unmonitored: UnmonitoredGuard | None = None
        if self.follower is not None:
            # the reader reached the log again: ship the spool now, not after the back-off
            self.follower.on_reachable = self.publisher.retry_now
            if pause_when_unmonitored_s is not None:
                self.unmonitored = UnmonitoredGuard(
                    pause_when_unmonitored_s, self.publisher, self.follower, run_id=run_id
                )
        self._seq = 0  # touched on the worker thread only
        self._started = False
        self._finished = False
        self._closed = False
        self._timed_steps: set[int] = set()  # steps whose row had timing_s/step (worker)
        self._last_step_end: float | None = None
        if install_exit_hooks:
            _install_exit_hooks(self)

    def _gateway(
        self, url: str, api_key: str | None, timeout_s: float
    ) -> tuple[Target, Callable[[], Any]]:
        """Where a hook behind the ingest gateway writes, and what its command reader
        reads (:mod:`producers.hooks.gateway`). Its producer must be a hook's."""
        from producers.hooks.gateway import GatewayLog

        key = api_key or os.environ.get("RUNWATCH_API_KEY") or ""
        if not key:
            raise ValueError("RunwatchHook: gateway= needs api_key= (or $RUNWATCH_API_KEY)")
        if not self.producer.startswith("hook/"):
            raise ValueError(
                f"RunwatchHook: behind a gateway the producer must begin 'hook/', not "
                f"{self.producer[:80]!r}"
            )
        GatewayLog(url, key)  # a bad URL is refused here, not on the worker thread
        run = self.run_id
        return Target.gateway(url, key, timeout_s), lambda: GatewayLog(
            url, key, timeout_s=5.0, only_key=run
        )

    # -- facts (training thread: each call is a queue put) ------------------------------------
    def start(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        resumed_from: str | None = None,
        resumed_step: int | None = None,
    ) -> None:
        """The run began (once per hook). ``resumed_from``: the checkpoint it restarted from."""
        if self._started:
            return
        self._started = True
        self._last_step_end = time.perf_counter()
        ts = time.time()
        if resumed_from is not None:
            follower = self.follower
            if follower is not None and (follower.run_is_paused() or follower.cancelled):
                return  # paused: the first obey() says RunPaused again; cancelled: it stops
            if follower is not None and follower.known is False:  # its first watched process
                attrs = _config_attributes(config or {})  # (the detectors need its algorithm)
                self._submit(
                    self._one, RunSubmitted, None, ts, algorithm=self.algorithm, config=attrs
                )
            self._submit(
                self._one,
                RunResumed,
                resumed_step,
                ts,
                reason=f"training restarted from {resumed_from}",
                checkpoint=str(resumed_from),
            )
            return
        attrs = _config_attributes(config or {})
        self._submit(self._one, RunSubmitted, None, ts, algorithm=self.algorithm, config=attrs)
        self._submit(self._one, RunStarted, None, ts)

    def log(self, metrics: Mapping[str, Any], step: int, ts: float | None = None) -> None:
        """One logged metric row at ``step`` (TRL / verl / any keys, as they are). The
        first fact of a hook never :meth:`start`-ed starts it (empty config)."""
        if not self._started:
            self.start()
        self._submit(self._row, dict(metrics), int(step), time.time() if ts is None else ts)

    def step_done(self, step: int, wall_s: float | None = None) -> None:
        """Optimizer step ``step`` finished; ``wall_s`` defaults to the time since the
        previous step ended (or :meth:`start`)."""
        now = time.perf_counter()
        if wall_s is None and self._last_step_end is not None:
            wall_s = now - self._last_step_end
        self._last_step_end = now
        if wall_s is not None:
            self._submit(self._step_timing, int(step), float(wall_s), time.time())

    def obey(self, step: int | None, waiting: Callable[[], None] | None = None) -> bool:
        """Act on the run's commands at a step boundary (training thread, after the step
        was reported): a pause blocks here until an unpause or a cancel; True once the run
        is cancelled — stop training (:mod:`producers.hooks.obey`). ``waiting``: called
        every poll while paused (a multi-process run's keepalive). Also holds the run while
        runwatch has been out of touch over ``pause_when_unmonitored_s``
        (:mod:`producers.hooks.unmonitored`)."""
        follower = self.follower
        if follower is None or self._closed:  # (after finish() too: a run that trains on
            return False  # after its end is live training, and the controller gates it)
        paused = follower.paused_s
        stop = follower.obey(step, waiting)
        guard = self.unmonitored
        if not stop and guard is not None:
            held = guard.holds
            stop = guard.hold(step, lambda: follower.obey(step, waiting), waiting, self._is_closed)
            if guard.holds != held:
                self._last_step_end = time.perf_counter()  # the time held is no step's time
        if follower.cancelled:
            self._finished = True  # RunCancelled is the run's last lifecycle fact
        if follower.paused_s != paused:
            self._last_step_end = time.perf_counter()  # the pause is no step's time
        return stop

    def _is_closed(self) -> bool:
        return self._closed

    @property
    def closed(self) -> bool:
        """:meth:`close` was called: nothing more is published or followed."""
        return self._closed

    def train_again(self, step: int, resumed_from: str) -> None:
        """The run trains again in this process after it :meth:`finish`-ed (a framework's
        second ``train()``: another stage, more steps): ``RunResumed`` as a restart's (it
        answers no request; the detectors judge the steps from ``step`` afresh), unless
        the run is paused (the next :meth:`obey` holds it) or cancelled (it stops it).
        Raises ``RuntimeError`` once the hook is closed (nothing could gate it)."""
        if self._closed:
            raise RuntimeError(
                f"runwatch: the hook of run {self.run_id} is closed; a training after it "
                "would be neither watched nor gated (give it a new hook)"
            )
        if not self._started:
            self.start(resumed_from=resumed_from, resumed_step=step)
            return
        if not self._finished:
            return  # still training: nothing ended
        follower = self.follower
        if follower is not None and follower.cancelled:
            return  # RunCancelled was its last fact: obey() stops the training
        self._finished = False
        self._last_step_end = time.perf_counter()
        if follower is not None and follower.run_is_paused():
            return  # the first obey() holds it (and says RunPaused again)
        reason = f"training began again from {resumed_from} (after the run's end)"
        self._submit(self._one, RunResumed, step, time.time(), reason=reason,
                     checkpoint=str(resumed_from))  # fmt: skip

    def _publish_now(self, cls: type[EventBase], step: int | None, **payload: Any) -> None:
        self._submit(self._one, cls, step, time.time(), **payload)

    def checkpoint(self, path: str | os.PathLike[str], step: int) -> None:
        """A checkpoint was written (complete) at ``path``; digested off-thread."""
        self._submit(self._checkpoint, str(path), int(step), time.time())

    def finish(self, ok: bool = True, reason: str = "", step: int | None = None) -> None:
        """The run ended: ``RunCompleted``, or ``RunFailed`` with ``reason`` (once)."""
        if self._finished:
            return
        self._finished = True
        if ok:
            self._submit(self._one, RunCompleted, step, time.time())
        else:
            self._submit(self._one, RunFailed, step, time.time(), reason=reason or "failed")

    # -- delivery -----------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every fact so far is on the log or in the spool."""
        return self.publisher.flush(timeout_s)

    def close(self, timeout_s: float = 30.0) -> Stats:
        """Deliver everything (shipping the spool if the log is back, until ``timeout_s``)
        and stop the worker. Does not publish ``RunCompleted``: call :meth:`finish`."""
        self._closed = True
        if self.follower is not None:
            self.follower.close()
        return self.publisher.close(timeout_s)

    def stats(self) -> dict[str, Any]:
        self.publisher.stats.submitted_jobs = self.publisher._submitted
        out = self.publisher.stats.as_dict()
        out["mapped"] = dict(sorted(self.report.mapped.items()))
        guard = self.unmonitored
        if guard is not None:  # held because runwatch was out of touch: how often, how long
            out["unmonitored_holds"] = guard.holds
            out["unmonitored_held_s"] = round(guard.held_so_far(), 3)
            out["unmonitored_holding"] = guard.holding
        return out

    def __enter__(self) -> RunwatchHook:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.finish(ok=False, reason=f"{exc_type.__name__}: {exc}")
        self.close()

    # -- the worker's side: facts -> events --------------------------------------------------
    def _submit(self, fn: Callable[..., Sequence[EventBase]], *args: Any, **kw: Any) -> None:
        if self._closed:
            return
        self.publisher.submit(partial(fn, *args, **kw))

    def _event(self, cls: type[EventBase], step: int | None, ts: float, **payload: Any):
        """The next event of this hook; its text cut (:func:`~producers.hooks.obey.
        cut_payload`: a traceback in a reason, a long path; the gateway refuses text
        over twice the cut, and the read models keep a run's lifecycle facts whole)."""
        event = cls(
            event_id=uuid.uuid4(),
            tenant_id=self.tenant_id,
            run_id=self.run_id,
            step=step,
            ts=ts,
            producer=self.producer,
            seq=self._seq,
            **cut_payload(payload),
        )
        self._seq += 1
        return event

    def _one(self, cls: type[EventBase], step: int | None, ts: float, **payload: Any):
        return [self._event(cls, step, ts, **payload)]

    def _row(self, metrics: dict[str, Any], step: int, ts: float) -> list[EventBase]:
        row = normalized(metrics)
        planned = row_events(
            row, step=step, ts=ts, algorithm=self.algorithm, gpus=self.gpus, report=self.report
        )
        if any(cls is StepPhaseTimed for cls, *_ in planned):
            self._timed_steps.add(step)
        return [self._event(cls, at, when, **payload) for cls, at, when, _, payload in planned]

    def _step_timing(self, step: int, wall_s: float, ts: float) -> list[EventBase]:
        if step in self._timed_steps:  # the framework timed it itself (verl timing_s/step)
            self._timed_steps.discard(step)
            return []
        out = [self._event(StepPhaseTimed, step, ts, wall_s=wall_s, other_s=wall_s)]
        # a step time given as negative or NaN is kept as timing, never billed (usage is
        # finite and >= 0: the event would refuse it, and the step's timing with it)
        billed = billed_seconds(wall_s, self.gpus)
        if billed is not None:
            out.append(
                self._event(
                    UsageRecorded,
                    step,
                    ts,
                    pool="trainer",
                    phase="step",
                    device_kind="gpu",
                    device_seconds=billed,
                )
            )
        return out

    def _checkpoint(self, path: str, step: int, ts: float) -> list[EventBase]:
        sentinels, size = checkpoint_sentinels(Path(path), self.checkpoint_digest)
        digest = (
            "sha256:"
            + hashlib.sha256(
                "\n".join(f"{k}={v}" for k, v in sorted(sentinels.items())).encode()
            ).hexdigest()
        )
        return [
            self._event(
                CheckpointWritten,
                step,
                ts,
                path=path,
                checkpoint_schema=0,
                digest=digest,
                sentinels=sentinels,
                size_bytes=size,
            )
        ]


def checkpoint_sentinels(root: Path, algo: DigestAlgo) -> tuple[dict[str, str], int]:
    """Per file under ``root`` (relative path) its digest, and the total size in bytes.
    ``none``: sizes only (``size:N``). A file that vanished meanwhile is ``missing``."""
    sentinels: dict[str, str] = {}
    total = 0
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for p in files:
        name = p.name if p == root else str(p.relative_to(root))
        try:
            size = p.stat().st_size
            total += size
            sentinels[name] = f"size:{size}" if algo == "none" else _file_digest(p, algo)
        except OSError:
            sentinels[name] = "missing"
    return sentinels, total


def _file_digest(path: Path, algo: DigestAlgo) -> str:
    with open(path, "rb") as f:
        if algo == "crc32":
            crc = 0
            while chunk := f.read(1 << 22):
                crc = zlib.crc32(chunk, crc)
            return f"crc32:{crc:08x}"
        h = hashlib.sha256()
        while chunk := f.read(1 << 22):
            h.update(chunk)
        return "sha256:" + h.hexdigest()


def _config_attributes(config: Mapping[str, Any]) -> dict[str, Any]:
    """Scalars of ``config`` (nested mappings flattened with ``/``), the first
    :data:`MAX_CONFIG_KEYS` of them in key order, each at most :data:`MAX_CONFIG_CHARS`."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        else:
            found = scalar(value)
            if isinstance(found, str):  # a list of 200k files: cut, and says so
                found = cut_text(found, MAX_CONFIG_CHARS)
            flat[prefix] = found

    walk("", config)
    return dict(sorted(flat.items())[:MAX_CONFIG_KEYS])


# -- process exit: close every live hook, publish RunFailed on an uncaught exception -------
_HOOKS: weakref.WeakSet[RunwatchHook] = weakref.WeakSet()
_INSTALLED = threading.Lock()
_installed = False


def _install_exit_hooks(hook: RunwatchHook) -> None:
    global _installed
    _HOOKS.add(hook)
    with _INSTALLED:
        if _installed:
            return
        _installed = True
        previous = sys.excepthook

        def excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
            for h in list(_HOOKS):
                if h._started and not h._finished:
                    h.finish(ok=False, reason=f"{exc_type.__name__}: {exc}")
            previous(exc_type, exc, tb)

        sys.excepthook = excepthook
        atexit.register(_close_all)


def _close_all() -> None:
    for h in list(_HOOKS):
        if not h._closed:
            stats = h.close(timeout_s=float(os.environ.get("RUNWATCH_HOOK_EXIT_TIMEOUT", "30")))
            if stats.left_in_spool:
                print(
                    f"runwatch: {stats.left_in_spool} events of run {h.run_id} wait in the "
                    f"spool {h.publisher.spool_dir}",
                    file=sys.stderr,
                )
