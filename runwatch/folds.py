"""Which folds the processors run: one list, shared by ``runwatch process`` (embedded or
faust) and ``runwatch replay``. Add a fold here and both hosts and the replay pick it up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from events.fold import Fold


def processor_folds(
    catalog: str | Path | None = None, control: str | Path | bool | None = None
) -> list[Fold[Any]]:
    """The stream processors' folds, in the order their outputs are replayed.

    ``catalog``: the detector threshold catalog (default: the packaged ``catalog.yaml``).
    ``control``: run the run controller (paging alerts -> ``PauseRequested``) under this
    control policy file, or the packaged one for ``True``. Off by default until the
    run-state projection, the demo and the API follow the trainer's ``RunPaused``
    (issue #14); a bad policy file is a ``ValueError``.
    """
    from stream_processors.detectors import RunHealthFold, load_catalog
    from stream_processors.profiling import ProfilingFold

    # profiling first: its per-step RolloutBatchCompleted feed the detectors' drift input
    folds: list[Fold[Any]] = [ProfilingFold(), RunHealthFold(load_catalog(catalog))]
    if control:
        from stream_processors.control import ControlPolicy, RunControllerFold

        path = None if control is True else control
        folds.append(RunControllerFold(ControlPolicy.load(path)))
    return folds
