"""Run-health detectors (seed 000's alert catalog) as pure folds over one run's telemetry.

One module per detector; :class:`~stream_processors.detectors.run_health.RunHealthFold`
hands each event to every detector that wants it. Thresholds live in ``catalog.yaml``
(see :mod:`stream_processors.detectors.config`); measured false-positive rates and lags
in ``QUALITY.md`` beside it.
"""

from stream_processors.detectors.config import Catalog, CatalogError, defaults, load_catalog
from stream_processors.detectors.registry import ALGORITHMIC, DETECTORS, RUN_MECHANICS
from stream_processors.detectors.run_health import RunHealthFold, RunHealthState

__all__ = [
    "ALGORITHMIC",
    "DETECTORS",
    "RUN_MECHANICS",
    "Catalog",
    "CatalogError",
    "RunHealthFold",
    "RunHealthState",
    "defaults",
    "load_catalog",
]
