"""Tenant accounting (seed 000 step 4): metered usage becomes money, as a stream processor.

:class:`AccountingFold` is the pure fold (one run's usage and spend, keyed by ``run_id``;
a :class:`~events.TenantUsageUpdated` per committed step); :class:`Prices` its price list
(``prices.yaml`` beside it: configuration, not code). Hosted like the detectors, by the
embedded host and the faust app (``runwatch.folds.processor_folds``); the read model shows
what it derives (``docs/hosting.md``: which fold lives where, and why).
"""

from stream_processors.accounting.fold import PRODUCER, AccountingFold, RunUsage
from stream_processors.accounting.prices import Prices

__all__ = ["PRODUCER", "AccountingFold", "Prices", "RunUsage"]
