"""The projections' query API, assembled: its follower, its app, its keys (no CLI here).

Assembly only (no domain logic): a follower thread that tails the read model's input
topics (embedded log or Kafka) into the read model's host (:func:`runwatch.hosting.
read_model.read_model_host`: views + offsets committed together), the FastAPI app, the
keys file watched (an edit applies at the next request; SIGHUP reads it at once) and the
metrics token. ``runwatch serve api`` (:mod:`runwatch.cli.serve_api`) puts them together
with the Prometheus exporter; what they have to say goes to the callables they are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Say = Callable[[str], None]


def open_backend(kafka: str | None, log_dir: str | Path, readonly: bool = False) -> Any:
    """Kafka when a bootstrap address is given, else the embedded log at ``log_dir``."""
    if kafka:
        from events.log.kafka import KafkaLog

        return KafkaLog(kafka, client_id="runwatch-projections")
    from events.log.embedded import EmbeddedLog

    # a follower that does not --publish only reads: it never repairs nor writes the log
    return EmbeddedLog(log_dir, readonly=readonly)


#: Seconds without progress after which the follower counts as stalled (``/healthz`` 503).
STALL_S = 30.0
#: First and longest wait between the follower's attempts (seconds; doubling).
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0


class FollowerHealth:
    """How the follower is doing, for ``/healthz`` (written by the follower's thread, read
    by the API's; single attribute writes, so no lock).

    Progress is a poll that came back empty (caught up) or a commit. The follower is
    *stalled* when it made none for ``stall_s`` seconds: it keeps failing and retrying, or
    it is blocked (a commit waiting on a lock). It is *stopped* when its thread ended
    without being asked to. Either way the views are no longer kept up to date."""

    def __init__(self, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic):
        self.stall_s = stall_s
        self.clock = clock
        self.last_progress = clock()
        self.progressed = 0  # progress count: an attempt compares it before and after
        self.failures = 0  # attempts failed since the last progress
        self.stopped: str | None = None

    def progress(self) -> bool:
        """Note progress; ``True`` when it ends a run of failures (a recovery)."""
        self.last_progress = self.clock()
        self.progressed += 1
        recovered, self.failures = self.failures > 0, 0
        return recovered

    def problem(self) -> str | None:
        """Why the views are not kept up to date, or ``None``. Says nothing of the
        errors themselves (``/healthz`` answers anyone; the log has them)."""
        if self.stopped is not None:
            return "projection follower stopped: the views are no longer updated"
        idle = self.clock() - self.last_progress
        if idle <= self.stall_s:
            return None
        why = f"retrying after {self.failures} failed attempts" if self.failures else "blocked"
        return f"projection follower stalled: no progress for {idle:.0f} s ({why})"


class _WatchedConsumer:
    """A log consumer that reports progress: an empty poll, a commit."""

    def __init__(self, inner: Any, progress: Callable[[], None]) -> None:
        self._inner, self._progress = inner, progress

    def __getattr__(self, name: str) -> Any:  # positions, close, ...: the consumer's own
        return getattr(self._inner, name)

    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> Any:
        records = await self._inner.poll(max_records, timeout_s=timeout_s)
        if not records:
            self._progress()
        return records

    async def commit(self) -> None:
        await self._inner.commit()
        self._progress()


class _WatchedBackend:
    """A log backend whose consumers are :class:`_WatchedConsumer`."""

    def __init__(self, inner: Any, progress: Callable[[], None]) -> None:
        self._inner, self._progress = inner, progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def consumer(self, group_id: str, topics: Any) -> _WatchedConsumer:
        return _WatchedConsumer(await self._inner.consumer(group_id, topics), self._progress)


@dataclass
class Follower:
    """The running follower: its thread, its health, and how to stop it."""

    thread: threading.Thread
    health: FollowerHealth
    stop: Callable[[], None]


def start_follower(  # type: ignore[no-untyped-def]
    open_backend: Callable[[], Any],
    open_host: Callable[[], Any],
    settle_s: float,
    publish: bool,
    group_id: str,
    on_error: Say,
    on_info: Say | None = None,
    *,
    stall_s: float = STALL_S,
    retry_s: tuple[float, float] = (RETRY_FIRST_S, RETRY_MAX_S),
) -> Follower:
    """Run :func:`runwatch.hosting.follow.follow` on a thread of its own until stopped.

    Each attempt opens a fresh backend (``open_backend()``) and a host resumed from the
    store's last commit (``open_host()``: what was folded but not committed is read
    again, as after a crash). An attempt that fails (``EMFILE`` when connections took
    every descriptor, a broker away, a locked store, ...) is reported to ``on_error`` and
    retried after ``retry_s[0]`` seconds, doubling up to ``retry_s[1]`` (back to the first
    after an attempt that made progress); ``on_info`` hears of the recovery. Meanwhile
    the API serves the last committed view, and ``/healthz`` says when the follower
    stalls (:class:`FollowerHealth`)."""
    from runwatch.hosting.follow import follow

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    health = FollowerHealth(stall_s)
    first_s, max_s = retry_s

    def progress() -> None:
        if health.progress() and on_info is not None:
            on_info("projection follower recovered")

    async def attempt() -> None:
        host = open_host()
        try:
            backend = open_backend()
            try:
                await backend.start()
                await follow(
                    _WatchedBackend(backend, progress),  # type: ignore[arg-type]
                    host,
                    stop,
                    group_id=group_id,
                    publish_to=backend if publish else None,
                    settle_s=settle_s,
                )
            finally:
                with contextlib.suppress(Exception):
                    await backend.close()
        finally:
            _close_host(host)

    async def main() -> None:
        delay = first_s
        while not stop.is_set():
            before = health.progressed
            try:
                await attempt()
            except Exception as exc:  # retried: the API keeps serving the last commit
                health.failures += 1
                delay = first_s if health.progressed != before else delay
                on_error(
                    f"projection follower failed (attempt {health.failures}): {exc!r}; "
                    f"retrying in {delay:g} s"
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, max_s)

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # not an Exception (those are retried): it ends here
            health.stopped = repr(exc)
            on_error(f"projection follower stopped: {exc!r}")
        finally:
            loop.close()

    thread = threading.Thread(target=target, name="projection-follower", daemon=True)
    thread.start()

    def request_stop() -> None:
        with contextlib.suppress(RuntimeError):  # its loop already closed: nothing to stop
            loop.call_soon_threadsafe(stop.set)

    return Follower(thread, health, request_stop)


def _close_host(host: Any) -> None:
    """Close the read model a host folds into (its SQLite connection on this thread)."""
    read_model = getattr(getattr(host, "store", None), "read_model", None)
    close = getattr(read_model, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


def read_token(path: str) -> str:
    """The bearer token: the first line of ``path`` (a ``ValueError`` if none)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"metrics token file not readable: {path} ({exc.strerror})") from None
    token = text.splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ValueError(f"metrics token file is empty: {path}")
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def watch_keys(keys, info: Say, error: Say) -> None:  # type: ignore[no-untyped-def]
    """Report key-file reloads on stderr, and read the file again on SIGHUP."""
    logger = logging.getLogger("runwatch.keys")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("keys: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

    def reload_now() -> None:
        changed = keys.reload()
        if keys.error:
            error(f"SIGHUP: API keys not reloaded: {keys.error}; keeping the previous keys")
        else:
            info(f"SIGHUP: API keys {'reloaded' if changed else 'unchanged'}")

    def on_hup(signum, frame):  # type: ignore[no-untyped-def]
        keys.request_reload()
        # never take the keys' lock inside the handler: it may have interrupted a holder
        threading.Thread(target=reload_now, name="keys-reload", daemon=True).start()

    if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, on_hup)


def command_sink(kafka: str | None, log_dir: str | Path) -> Any:
    """Where the API writes commands: the followed log's control topic."""
    if kafka is not None:
        from producers.sinks import KafkaSink

        return KafkaSink(kafka)
    from events.log.embedded import EmbeddedLog
    from producers.sinks import EmbeddedSink

    # an unopened writable log: appends touch (and lock) only the control topic
    return EmbeddedSink(EmbeddedLog(log_dir))


def build_app(store, keys, commands=None, **options):  # type: ignore[no-untyped-def]
    """The query API app as served: :func:`projections.api.create_app` (``options``: its
    keyword options: ``health``, the command rate, the body cap) with the 422 handler that
    renders any input (:mod:`runwatch.apps.http_errors`)."""
    from projections.api import create_app
    from runwatch.apps.http_errors import install

    return install(create_app(store, keys, commands=commands, **options))
