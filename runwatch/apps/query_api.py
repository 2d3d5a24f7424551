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
import ipaddress
import logging
import signal
import threading
from collections.abc import Callable
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


def start_follower(  # type: ignore[no-untyped-def]
    backend, host, settle_s: float, publish: bool, group_id: str, on_error: Say
):
    """Run :func:`runwatch.hosting.follow.follow` on a thread of its own; returns
    (thread, stop). ``on_error``: told why, if the follower stops (the API keeps serving
    the last committed view)."""
    from runwatch.hosting.follow import follow

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        await backend.start()
        try:
            await follow(
                backend,
                host,
                stop,
                group_id=group_id,
                publish_to=backend if publish else None,
                settle_s=settle_s,
            )
        finally:
            await backend.close()

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except Exception as exc:  # the API keeps serving the last committed view
            on_error(f"projection follower stopped: {exc!r}")

    thread = threading.Thread(target=target, name="projection-follower", daemon=True)
    thread.start()

    def request_stop() -> None:
        loop.call_soon_threadsafe(stop.set)

    return thread, request_stop


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


def build_app(store, keys, commands=None):  # type: ignore[no-untyped-def]
    """The query API app as served: :func:`projections.api.create_app` with the 422
    handler that renders any input (:mod:`runwatch.apps.http_errors`)."""
    from projections.api import create_app
    from runwatch.apps.http_errors import install

    return install(create_app(store, keys, commands=commands))
