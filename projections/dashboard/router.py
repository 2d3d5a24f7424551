"""Routes of the customer dashboard (included by :func:`projections.api.create_app`).

- ``GET /dashboard``: the page. Static, holds no data and needs no key: the page asks for
  the API key (or takes it from the URL fragment ``#key=...``, which never reaches a server
  log) and sends it as ``X-API-Key`` to the customer API (``/v1/runs``, ``/v1/runs/{id}``,
  ``/v1/runs/{id}/charts``, ``/v1/usage``).
- ``GET /dashboard/static/{name}``: its script and style sheet (package data files beside
  this module: ``index.html``, ``app.js``, ``app.css``) and its icon.
- ``GET /dashboard/api/runs/{run_id}/alerts``: the run's alerts as a customer sees them.
  Same key handling and tenant isolation as the query API (a foreign run and an unknown
  run are the same ``404``). Only the algorithmic layer is shown (seed 000 step 5: the
  service detects, the customer decides); run-mechanics and platform alerts, and alerts
  on internal-only signals (gradient norms), stay on the operator view. Thresholds,
  observed values, routing and catalog versions are internal too.

Every response carries a strict Content-Security-Policy: the page loads nothing but its
own files, and the script builds the DOM with ``textContent`` only.
"""

# No ``from __future__ import annotations``: FastAPI resolves the dependency annotations.
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel

from projections.auth import principal_of
from projections.keys import ApiKeys, Principal
from projections.store import ReadModel

#: Alert layers a customer sees; the others (run_mechanics, infra) are operator-only.
CUSTOMER_ALERT_LAYERS = frozenset({"algorithmic"})
#: Detectors on signals the seed keeps internal (gradient norms, clip fractions).
INTERNAL_DETECTORS = frozenset({"grad_norm_spike"})
TITLES = {
    "reward_hacking": "Possible reward hacking",
    "kl_blowup": "KL blowup",
    "entropy_collapse": "Entropy collapse",
    "reward_explosion_collapse": "Reward out of range",
    "dead_run": "Run not learning",
    "nan_metric": "NaN or infinite metric",
    "rollout_drift": "Rollout quality drift",
    "eval_gate_missing": "Eval gate missing",
}
SEVERITY = {"page": "critical", "ticket": "warning", "advisory": "info"}
STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
ICON_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    b'<rect width="32" height="32" rx="7" fill="#1d4ed8"/>'
    b'<path d="M5 21h5l3-9 5 13 3-8h6" fill="none" stroke="#fff" stroke-width="2.6" '
    b'stroke-linecap="round" stroke-linejoin="round"/></svg>\n'
)
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class CustomerAlert(BaseModel):
    alert_id: str
    detector: str
    title: str
    severity: str
    reason: str
    first_response: str
    fired_step: int | None
    fired_ts: float | None
    window_start: int | None
    window_end: int | None
    active: bool
    resolved_ts: float | None
    resolved_reason: str | None


class AlertList(BaseModel):
    run_id: str
    items: list[CustomerAlert]


def _asset(name: str) -> bytes:
    if name == "icon.svg":
        return ICON_SVG
    return resources.files("projections.dashboard").joinpath(name).read_bytes()


def customer_alerts(alerts: dict[str, dict[str, Any]]) -> list[CustomerAlert]:
    """The customer-visible subset of a run view's alerts, oldest first."""
    out = []
    for alert_id, a in alerts.items():
        detector = a.get("detector", "")
        if a.get("layer") not in CUSTOMER_ALERT_LAYERS or detector in INTERNAL_DETECTORS:
            continue  # also drops a resolution whose firing was never seen (no layer)
        out.append(
            CustomerAlert(
                alert_id=alert_id,
                detector=detector,
                title=TITLES.get(detector, detector.replace("_", " ").capitalize()),
                severity=SEVERITY.get(a.get("routing", ""), "info"),
                reason=a.get("reason", ""),
                first_response=a.get("first_response", ""),
                fired_step=a.get("fired_step"),
                fired_ts=a.get("fired_ts"),
                window_start=a.get("window_start"),
                window_end=a.get("window_end"),
                active=a.get("resolved_ts") is None,
                resolved_ts=a.get("resolved_ts"),
                resolved_reason=a.get("resolved_reason"),
            )
        )
    out.sort(key=lambda x: (x.fired_step if x.fired_step is not None else -1, x.alert_id))
    return out


def create_router(store: ReadModel, keys: ApiKeys) -> APIRouter:
    router = APIRouter()

    principal = principal_of(keys)  # the query API's own dependency

    @router.get("/dashboard", include_in_schema=False)
    def page() -> Response:
        return Response(_asset("index.html"), media_type="text/html", headers=SECURITY_HEADERS)

    @router.get("/dashboard/", include_in_schema=False)
    def page_slash() -> RedirectResponse:
        return RedirectResponse("/dashboard", status_code=308)

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        media = STATIC.get(name)
        if media is None:  # a fixed allow-list: no path ever reaches the file system
            raise HTTPException(404, "not found")
        return Response(_asset(name), media_type=media, headers=SECURITY_HEADERS)

    @router.get("/dashboard/api/runs/{run_id}/alerts", response_model=AlertList, tags=["customer"])
    def alerts(run_id: str, who: Annotated[Principal, Depends(principal)]) -> AlertList:
        """Your run's algorithmic-health alerts, in plain language (oldest first)."""
        # tenant in the lookup: a foreign run and an unknown one cost the same (no oracle)
        view = store.get_run(run_id, None if who.operator else who.tenant_id)
        if view is None or not who.can_read(view.tenant_id):
            raise HTTPException(404, "run not found")  # foreign and unknown look the same
        return AlertList(run_id=run_id, items=customer_alerts(view.alerts))

    return router
