"""The trajectory API's ingress (seed 004): Atropos-compatible write endpoints that turn
requests into events on the log, plus the middleware in front of the whole API: access
(bearer token, foreign web pages, Host) and request bodies (bounded size, gzip inflated as
it streams, a budget of bytes in flight)."""

from producers.trajectory_api.access import AccessMiddleware
from producers.trajectory_api.request_body import BodyBudget, RequestBodyMiddleware
from producers.trajectory_api.router import IngressHost, build_router

__all__ = [
    "AccessMiddleware",
    "BodyBudget",
    "IngressHost",
    "RequestBodyMiddleware",
    "build_router",
]
