"""Trajectory batching (seed 004): the pure fold that turns accepted scored groups and
batch requests into served batches, exactly ``batch_size`` sequences each."""

from stream_processors.batching.fold import BatchingFold, BatchingState, fold_all
from stream_processors.batching.selection import Queued, select_batch, subset_sum, unbatchable

__all__ = [
    "BatchingFold",
    "BatchingState",
    "Queued",
    "fold_all",
    "select_batch",
    "subset_sum",
    "unbatchable",
]
