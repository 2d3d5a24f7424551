"""Hosts for pure folds (composition root): the embedded runner and the faust app.

Both are generic over :class:`events.fold.Fold` and share :mod:`runwatch.hosting.core`
(per-key slots, dedupe by event id), so a fold hosted either way emits the same derived
events, ids included.
"""
