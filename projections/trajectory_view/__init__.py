"""The trajectory read model (seed 004): status, info and formed batches of a run's
trajectory buffer, folded from its events, and the HTTP router serving them."""

from projections.trajectory_view.store import MemoryPayloads, PayloadStore, SpillPayloads
from projections.trajectory_view.view import TrajectoryView

__all__ = ["MemoryPayloads", "PayloadStore", "SpillPayloads", "TrajectoryView"]
