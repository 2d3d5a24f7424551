"""The trajectory API's ingress (seed 004): Atropos-compatible write endpoints that turn
requests into events on the log, plus the request-body middleware (bounded size, gzip
inflated as it streams, a budget of bytes in flight)."""

from producers.trajectory_api.request_body import BodyBudget, RequestBodyMiddleware
from producers.trajectory_api.router import IngressHost, build_router

__all__ = ["BodyBudget", "IngressHost", "RequestBodyMiddleware", "build_router"]
