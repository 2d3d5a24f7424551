"""The trajectory API's ingress (seed 004): Atropos-compatible write endpoints that turn
requests into events on the log, plus the gzip request middleware."""

from producers.trajectory_api.gzip_request import GzipRequestMiddleware
from producers.trajectory_api.router import IngressHost, build_router

__all__ = ["GzipRequestMiddleware", "IngressHost", "build_router"]
