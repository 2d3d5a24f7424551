"""The customer dashboard: a web page served by the query API (seed 000 step 5).

``/dashboard`` is a single page (``index.html``, ``app.js``, ``app.css`` beside this module,
shipped as package data; charts drawn as inline SVG; no CDN, no external asset) that reads
the customer API with the tenant's key: the runs with their state and plain-language
reason, and per run the minimal chart set (reward, KL, eval-gate scores, spend so far) and
the run's alerts.

:func:`create_router` is included by :func:`projections.api.create_app`.
"""

from projections.dashboard.router import CUSTOMER_ALERT_LAYERS, create_router

__all__ = ["CUSTOMER_ALERT_LAYERS", "create_router"]
