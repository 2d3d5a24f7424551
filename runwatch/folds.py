"""Which folds the processors run: one list, shared by ``runwatch process`` (embedded or
faust) and ``runwatch replay``. Add a fold here and both hosts and the replay pick it up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from events.fold import Fold


def processor_folds(catalog: str | Path | None = None) -> list[Fold[Any]]:
    """The stream processors' folds, in the order their outputs are replayed.

    ``catalog``: the detector threshold catalog (default: the packaged ``catalog.yaml``).
    """
    from stream_processors.detectors import RunHealthFold, load_catalog
    from stream_processors.profiling import ProfilingFold

    # profiling first: its per-step RolloutBatchCompleted feed the detectors' drift input
    return [ProfilingFold(), RunHealthFold(load_catalog(catalog))]
