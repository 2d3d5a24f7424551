"""Which folds the processors run: one list, shared by ``runwatch process`` (embedded or
faust) and ``runwatch replay``. Add a fold here and both hosts and the replay pick it up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from events.fold import Fold


def processor_folds(
    catalog: str | Path | None = None,
    control: str | Path | bool | None = True,
    prices: str | Path | None = None,
) -> list[Fold[Any]]:
    """The stream processors' folds, in the order their outputs are replayed.

    ``catalog``: the detector threshold catalog (default: the packaged ``catalog.yaml``).
    ``prices``: the accounting price list the dead-run alert prices its money with
    (default: the packaged ``projections/prices.yaml``, the one the bill uses).
    ``control``: the run controller's policy (paging alerts -> ``PauseRequested``): a
    file, ``True`` for the packaged one (the default), ``False`` for no controller (alerts
    then only inform). A bad policy file is a ``ValueError``. The controller comes last:
    it reads the alerts the detectors derive in the same pass.
    """
    from projections.policy import Prices
    from stream_processors.detectors import RunHealthFold, load_catalog
    from stream_processors.profiling import ProfilingFold

    # the dead-run alert's money: the accounting price list, so the alert and the bill agree
    price_list = Prices.load(prices)
    detectors = load_catalog(catalog).with_prices(price_list.usd_per_gpu_second, price_list.version)
    # profiling first: its per-step RolloutBatchCompleted feed the detectors' drift input
    folds: list[Fold[Any]] = [ProfilingFold(), RunHealthFold(detectors)]
    if control:
        from stream_processors.control import ControlPolicy, RunControllerFold

        path = None if control is True else control
        folds.append(RunControllerFold(ControlPolicy.load(path)))
    return folds
