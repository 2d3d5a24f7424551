"""The trajectory API's app: the ingress and serving routers over one host, and its log.

Assembly only: :func:`build_app` puts the Atropos-compatible routers (producers' ingress,
the projection's serving) and the middleware (CORS, access, bounded bodies, gzip) around a
:class:`~runwatch.apps.trajectories.TrajectoryHost`, started and stopped with the app.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware

from events.log.base import LogBackend
from producers.trajectory_api import AccessMiddleware, RequestBodyMiddleware
from producers.trajectory_api import build_router as build_ingress
from producers.trajectory_api.once import InFlight
from projections.trajectory_view.router import build_router as build_serving
from runwatch.apps.http_errors import install as install_422
from runwatch.apps.trajectories import TrajectoryHost


def build_app(host: TrajectoryHost) -> FastAPI:
    """The Atropos-compatible app over ``host`` (started and stopped with the app)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await host.start()
        try:
            yield
        finally:
            await host.stop()

    settings = host.settings
    app = FastAPI(title="AtroposLib API (runwatch)", lifespan=lifespan)
    # the last added runs first: CORS (preflights answered, allowed origins' answers
    # readable), then access (token, foreign pages, Host) before a body byte is read, then
    # the bounded body, then response gzip
    app.add_middleware(GZipMiddleware, minimum_size=1000, compresslevel=host.gzip_level)
    app.add_middleware(
        RequestBodyMiddleware,
        max_bytes=settings.max_body_bytes,
        budget=host.body_budget,
        timeout_s=settings.body_timeout_s,
    )
    app.add_middleware(
        AccessMiddleware, token=settings.token, allowed_origins=settings.cors_origins
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_credentials=False,  # the token is a header, not a cookie
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Content-Encoding"],
            max_age=600,
        )
    inflight = InFlight()
    app.include_router(build_ingress(host, inflight))
    app.include_router(build_serving(host))
    app.state.host = host
    app.state.inflight = inflight
    return install_422(app)


def open_backend(kafka: str | None, log_dir: str | None) -> LogBackend:
    """Kafka when a bootstrap address is given, else the embedded log at ``log_dir``."""
    if kafka:
        from events.log.kafka import KafkaLog

        # no linger: every append is one request's worth already, and a client waits on it
        return KafkaLog(kafka, client_id="runwatch-trajectories", producer_config={"linger_ms": 0})
    from events.log.embedded import EmbeddedLog
    from runwatch.settings import log_dir as default_log_dir

    return EmbeddedLog(default_log_dir(log_dir))
