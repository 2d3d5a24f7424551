"""Which folds run where: the composition root's lists.

- :func:`processor_folds`: the stream processors (profiling, the run-health detectors, the
  run controller, tenant accounting), shared by ``runwatch process`` (embedded or faust)
  and ``runwatch replay``. Add a fold here and both hosts and the replay pick it up.
- :func:`projection_folds`: what the read model's host folds (the run state machine, and
  tenant accounting's running totals for the views: the bills themselves are the
  processor's to publish). ``docs/hosting.md`` says which fold lives where, and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from events.fold import Fold
from runwatch.hosting.core import HostedFold


def processor_folds(
    catalog: str | Path | None = None,
    control: str | Path | bool | None = True,
    prices: Any = None,
) -> list[Fold[Any]]:
    """The stream processors' folds, in the order their outputs are replayed.

    ``catalog``: the detector threshold catalog (default: the packaged ``catalog.yaml``).
    ``control``: the run controller's policy (paging alerts -> ``PauseRequested``): a
    file, ``True`` for the packaged one (the default), ``False`` for no controller (alerts
    then only inform). A bad policy file is a ``ValueError``. The controller comes after
    the detectors: it reads the alerts they derive. ``prices``: tenant accounting's price
    list (a :class:`~stream_processors.accounting.Prices`, a file, or None: packaged); the
    dead-run alert prices its money with the same list, so the alert and the bill agree.
    """
    from stream_processors.accounting import AccountingFold, Prices
    from stream_processors.detectors import RunHealthFold, load_catalog
    from stream_processors.profiling import ProfilingFold

    if not isinstance(prices, Prices):
        prices = Prices.load(prices)
    detectors = load_catalog(catalog).with_prices(prices.by_kind_and_pool(), prices.version)
    # profiling first: its per-step RolloutBatchCompleted feed the detectors' drift input
    folds: list[Fold[Any]] = [ProfilingFold(), RunHealthFold(detectors)]
    if control:
        from stream_processors.control import ControlPolicy, RunControllerFold

        path = None if control is True else control
        folds.append(RunControllerFold(ControlPolicy.load(path)))
    folds.append(AccountingFold(prices))
    return folds


def projection_folds(policy: Any = None, prices: Any = None) -> list[HostedFold]:
    """The read model's folds, as its host runs them: no deduplication by event id (a
    read model applies each record once, by its stored position); the run-state fold's
    changes are its output; accounting is hosted for the views' running totals only (its
    bills are published by the processor of the same fold).

    ``policy``: a :class:`~projections.policy.RunStatePolicy` or None (packaged);
    ``prices``: a :class:`~stream_processors.accounting.Prices` or None (packaged)."""
    from projections.run_state import RunStateFold
    from stream_processors.accounting import AccountingFold

    return [
        HostedFold(RunStateFold(policy), dedupe=False),
        HostedFold(AccountingFold(prices, settle=False), dedupe=False, emit=False),
    ]
